"""`astraflow train recipes/tools_calculator.toml` end to end: the tiny tools policy's episodes
(tool_agent, hermes calls, ToolEnv with the calculator) train for real on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_tools_recipe_trains(tmp_path):
    sets = [
        "run.max_steps=2",
        "policies.policy.trainer.groups_per_step=2",
        "rollout.concurrency=32",
        "evaluation.every_steps=2",
        "evaluation.num_tasks=8",
        "dataflow.policies=[]",
        f"run.output_dir={json.dumps(str(tmp_path))}",
    ]
    argv = [
        sys.executable,
        "-m",
        "astraflow.cli.main",
        "train",
        "recipes/tools_calculator.toml",
        "--no-live",
    ]
    for s in sets:
        argv += ["--set", s]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    run_dir = tmp_path / "tools-calculator"
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    steps = [r for r in records if r.get("type") == "step"]
    assert [r["step"] for r in steps] == [1, 2]
    # the trained sequences hold whole tool-call episodes: a call (~80 tokens) plus the answer
    assert all(r["metrics"]["completions/mean_length"] > 20 for r in steps), steps
    evals = [r for r in records if r.get("type") == "eval"]
    assert evals and all(0.0 <= e["accuracy"] <= 1.0 for e in evals)
