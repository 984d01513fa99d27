"""The shared quickstart run of the slow tier: ONE `astraflow train recipes/quickstart.toml`
(4 small steps, two trainer processes, TLS, TensorBoard tracking, transcripts kept) that
tests/e2e/test_quickstart_run.py checks from every side, instead of one run per property."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "tools"))
from quickstart_run import QuickstartRun, train_quickstart  # noqa: E402
from test_train_e2e import SMALL  # noqa: E402

TWO = "policies.policy.trainer.processes=2"
#: what the shared run adds to the SMALL quickstart: each one a property checked on it
QUICKSTART_EXTRAS = [
    TWO,  # two trainer ranks (torchrun, gloo): rank 0 alone talks to the dataflow
    "security.tls=true",  # HTTPS between the services, role tokens
    'logging.backends=["tensorboard"]',  # metrics forwarded to TensorBoard
    "logging.transcripts_per_step=3",  # transcripts kept for `astraflow transcripts`
    "evaluation.at_start=false",
]


@pytest.fixture(scope="session")
def quickstart_run(tmp_path_factory) -> QuickstartRun:
    out = tmp_path_factory.mktemp("quickstart-run")
    return train_quickstart(out, [*SMALL, *QUICKSTART_EXTRAS])
