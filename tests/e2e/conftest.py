"""The shared quickstart run of the slow tier: ONE `astraflow train recipes/quickstart.toml`
(4 small steps, two trainer processes, TLS, TensorBoard tracking, transcripts kept) that
tests/e2e/test_quickstart_run.py checks from every side, instead of one run per property."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_train_e2e import SMALL

ROOT = Path(__file__).resolve().parents[2]
TWO = "policies.policy.trainer.processes=2"
#: what the shared run adds to the SMALL quickstart: each one a property checked on it
QUICKSTART_EXTRAS = [
    TWO,  # two trainer ranks (torchrun, gloo): rank 0 alone talks to the dataflow
    "security.tls=true",  # HTTPS between the services, role tokens
    'logging.backends=["tensorboard"]',  # metrics forwarded to TensorBoard
    "logging.transcripts_per_step=3",  # transcripts kept for `astraflow transcripts`
    "evaluation.at_start=false",
]


@dataclass
class SharedRun:
    run_dir: Path
    stdout: str
    stderr: str


@pytest.fixture(scope="session")
def quickstart_run(tmp_path_factory) -> SharedRun:
    out = tmp_path_factory.mktemp("quickstart-run")
    sets = [*SMALL, *QUICKSTART_EXTRAS, f"run.output_dir={json.dumps(str(out))}"]
    proc = subprocess.run(
        [sys.executable, "-m", "astraflow.cli.main", "train", "recipes/quickstart.toml", "--no-live",
         *[a for s in sets for a in ("--set", s)]],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return SharedRun(out / "quickstart", proc.stdout, proc.stderr)
