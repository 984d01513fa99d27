"""The multi-policy agentic recipe end to end (``recipes/multi_policy_agentic.toml``, 4 steps): the
solver's tries and the verifier's check both go through the latency-wrapped tools, and each policy
trains on its own role's samples with its own version stream."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from astraflow.dataflow.storage import history, store

# a whole two-policy training run: slow tier
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
STEPS = 4


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    sets = [
        f"run.max_steps={STEPS}",
        "tasks.group_size=4",
        "policies.solver.trainer.groups_per_step=2",
        "policies.verifier.trainer.groups_per_step=2",
        "rollout.concurrency=32",
        "evaluation.every_steps=0",
        "evaluation.at_start=false",
        # the same long-tailed shape, ten times shorter: the test is about the plumbing
        "tasks.env_latency.p50_s=0.03",
        "tasks.env_latency.p99_s=0.5",
        f"run.output_dir={json.dumps(str(out))}",
    ]
    argv = [
        sys.executable,
        "-m",
        "astraflow.cli.main",
        "train",
        "recipes/multi_policy_agentic.toml",
    ]
    argv += ["--no-live"]
    for s in sets:
        argv += ["--set", s]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out / "multi-policy-agentic"


def test_both_policies_train_their_own_roles(run_dir):
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if r["type"] == "step"]
    for policy in ("solver", "verifier"):
        assert [r["version"] for r in steps if r["policy"] == policy] == list(range(1, STEPS + 1))
    with store.read_only(run_dir / "dataflow.db") as tx:
        samples = history.samples(tx)
    roles: dict[str, set[str]] = {}
    for sample in samples:
        roles.setdefault(sample.policy, set()).add(sample.role)
    assert roles == {"solver": {"solver"}, "verifier": {"verifier"}}


def test_episodes_go_through_both_tools(run_dir):
    with store.read_only(run_dir / "dataflow.db") as tx:
        episodes = [e for e in history.episodes(tx) if not e.is_eval and not e.error]
    assert episodes
    turns = [e.info["metrics"]["turns"] for e in episodes]
    assert max(turns) > 1 and all(1 <= t <= 3 for t in turns)  # wrong answers got another try
    for e in episodes:
        info = e.info["info"]
        # the verifier's reward is its check tool's grade of the verdict: right or wrong
        right = info["verdict"] is not None and info["verdict"] == info["correct"]
        assert e.rewards == {"solver": float(info["correct"]), "verifier": float(right)}
        assert e.info["metrics"]["env_s"] > 0  # every episode waited on its tools
