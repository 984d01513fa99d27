"""`astraflow train` with ``workflow.name = "openai_agent"``: the built-in policy trains on
arithmetic through an agent written only with the ``openai`` SDK (no AstraFlow import)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("openai", reason="the openai SDK is in the test extra")

ROOT = Path(__file__).resolve().parents[2]
AGENT = Path(__file__).resolve().parent / "openai_agents" / "arith_agent.py"


@pytest.mark.slow
def test_an_openai_sdk_agent_trains_the_builtin_policy(tmp_path):
    sets = [
        "workflow.name=openai_agent",
        f"workflow.agent={json.dumps(f'{AGENT}:solve')}",
        "run.max_steps=3",
        "tasks.group_size=4",
        "policies.policy.trainer.groups_per_step=2",
        "rollout.concurrency=16",
        "evaluation.every_steps=3",
        "evaluation.num_tasks=16",
        f"run.output_dir={json.dumps(str(tmp_path))}",
    ]
    argv = [sys.executable, "-m", "cli.main", "train", "recipes/quickstart.toml", "--no-live"]
    for s in sets:
        argv += ["--set", s]
    proc = subprocess.run(
        argv, cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    run_dir = tmp_path / "quickstart"
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    steps = [r for r in records if r.get("type") == "step"]
    assert [r["version"] for r in steps] == [1, 2, 3]
    evals = [r for r in records if r.get("type") == "eval"]
    assert evals, "the held-out evaluation ran through the agent too"
    db = sqlite3.connect(run_dir / "dataflow.db")
    infos = [json.loads(row[0]) for row in db.execute("SELECT info FROM episodes")]
    # every episode came through the agent's SDK call, and the trained samples carry its tokens
    assert infos and all(i["metrics"].get("calls") == 1.0 for i in infos)
    n_samples, trained_tokens = db.execute(
        "SELECT COUNT(*), SUM(n_tokens) FROM samples WHERE policy='policy'"
    ).fetchone()
    assert n_samples > 0 and trained_tokens > 0
