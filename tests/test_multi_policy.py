"""Two policies trained together (solve_verify): independent trainers, buffers and version streams."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

# a whole two-policy training run: slow tier
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


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
        "cli.main",
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
    db = sqlite3.connect(run_dir / "dataflow.db")
    published = db.execute(
        "SELECT policy, version, created_at FROM versions ORDER BY created_at"
    ).fetchall()
    assert {p for p, _, _ in published} == {"solver", "verifier"}
    # replay the announcements: the two policies' versions diverge at some point (no lock-step)
    current = {"solver": 0, "verifier": 0}
    gaps = []
    for policy, version, _ in published:
        current[policy] = version
        gaps.append(abs(current["solver"] - current["verifier"]))
    assert max(gaps) >= 2, published


def test_each_trainer_gets_only_its_own_role(run_dir):
    db = sqlite3.connect(run_dir / "dataflow.db")
    roles = dict(
        db.execute("SELECT policy, GROUP_CONCAT(DISTINCT role) FROM samples GROUP BY policy")
    )
    assert roles == {"solver": "solver", "verifier": "verifier"}
    # every batch a trainer acknowledged belonged to that trainer's policy
    mixed = db.execute(
        "SELECT b.id FROM batches b JOIN groups g ON g.batch_id = b.id "
        "JOIN samples s ON s.group_id = g.id WHERE s.policy != g.policy"
    ).fetchall()
    assert mixed == []


def test_nodes_updated_both_policies(run_dir):
    log = (run_dir / "logs" / "node-0.log").read_text()
    assert "policy solver: v" in log and "policy verifier: v" in log
