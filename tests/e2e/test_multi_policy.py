"""Two policies trained together (solve_verify): independent trainers, buffers and version streams."""

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


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    sets = [
        "run.max_steps=6",
        "tasks.group_size=4",
        "rollout.concurrency=16",
        "evaluation.every_steps=0",
        # the verifier's trainer does twice the work per step, so the two streams cannot stay in
        # lock-step unless something forces them to
        "policies.solver.trainer.groups_per_step=2",
        "policies.verifier.trainer.groups_per_step=4",
        f"run.output_dir={json.dumps(str(out))}",
    ]
    argv = [
        sys.executable,
        "-m",
        "astraflow.cli.main",
        "train",
        "recipes/multi_policy_math.toml",
        "--no-live",
    ]
    for s in sets:
        argv += ["--set", s]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out / "multi-policy-math"


def test_both_version_streams_advance(run_dir):
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if r["type"] == "step"]
    for policy in ("solver", "verifier"):
        mine = [r for r in steps if r["policy"] == policy]
        assert [r["version"] for r in mine] == [1, 2, 3, 4, 5, 6], policy
    with store.read_only(run_dir / "dataflow.db") as tx:
        published = history.versions(tx)  # in announcement order
    assert {v.policy for v in published} == {"solver", "verifier"}
    # replay the announcements: the two policies' versions diverge at some point (no lock-step)
    current = {"solver": 0, "verifier": 0}
    gaps = []
    for v in published:
        current[v.policy] = v.version
        gaps.append(abs(current["solver"] - current["verifier"]))
    assert max(gaps) >= 2, published


def test_each_trainer_gets_only_its_own_role(run_dir):
    with store.read_only(run_dir / "dataflow.db") as tx:
        samples, batches = history.samples(tx), history.batches(tx)
    roles: dict[str, set[str]] = {}
    for sample in samples:
        roles.setdefault(sample.policy, set()).add(sample.role)
    assert roles == {"solver": {"solver"}, "verifier": {"verifier"}}
    # every batch a trainer was served holds only that trainer's policy's samples
    policy_of = {b.id: b.policy for b in batches}
    mixed = [s.id for s in samples if s.batch_id and s.policy != policy_of[s.batch_id]]
    assert mixed == []


def test_nodes_updated_both_policies(run_dir):
    log = (run_dir / "logs" / "node-0.log").read_text()
    assert "policy solver: v" in log and "policy verifier: v" in log
