"""`astraflow eval run`: scores from real episodes through the training workflow and env runner."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from astraflow.rollout.evaluation.agents import ScriptedAgent
from astraflow.rollout.evaluation.tasksets import (
    TaskSetEval,
    evaluate_task_set,
    ks_for,
    pass_at_k,
)

ROOT = Path(__file__).resolve().parents[2]


def test_pass_at_k_estimator():
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(4, 3, 2) == 1.0
    assert ks_for(1) == [1] and ks_for(4) == [1, 2, 4] and ks_for(5) == [1, 2, 4, 5]


def _half_right_agent(payloads: dict[str, str]) -> ScriptedAgent:
    """Answers the first sample of every task right and the others wrong, through the env."""

    def script_for(task):
        right = task.meta["sample"] == 0
        answer = payloads[task.meta["payload_id"]]
        return lambda obs: answer if right else "nonsense"

    return ScriptedAgent("half", script_for)


def test_scores_come_from_the_env_through_the_workflow():
    from astraflow.tasks.catalog import load_task_set

    payloads = load_task_set("arith", "test", limit=3)
    agent = _half_right_agent({p["id"]: p["answer"] for p in payloads})
    config = TaskSetEval(
        env="astraflow/Math-v0", task_set="arith", split="test", limit=3, samples=2
    )
    report = asyncio.run(evaluate_task_set(agent, config))
    s = report["summary"]
    assert (s["tasks"], s["samples"], s["errors"]) == (3, 6, 0)
    assert s["accuracy"] == pytest.approx(0.5)
    assert s["pass_at_k"] == {"1": pytest.approx(0.5), "2": 1.0}
    assert s["mean_turns"] == 1.0 and s["mean_tokens"] > 0
    rows = report["samples"]
    assert [r["success"] for r in rows] == [True, False] * 3
    assert all(r["finish_reason"] == "terminated" for r in rows)


def test_unknown_env_and_set_are_named():
    agent = ScriptedAgent("x", lambda task: lambda obs: "")
    with pytest.raises(KeyError, match="Math-v0"):
        asyncio.run(evaluate_task_set(agent, TaskSetEval(env="astraflow/Mat-v0", task_set="arith")))
    with pytest.raises(KeyError, match="did you mean arith"):
        asyncio.run(evaluate_task_set(agent, TaskSetEval(env="astraflow/Math-v0", task_set="arth")))


@pytest.mark.slow
def test_cli_eval_run_on_the_builtin_policy(tmp_path):
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "astraflow.cli.main", "eval", "run", "--policy", "builtin:tiny-arith",
         "--env", "astraflow/Math-v0", "--tasks", "arith:test", "--limit", "4", "--samples", "2",
         "--max-tokens", "12", "--device", "cpu", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for word in ("accuracy", "pass@2", "mean turns", "mean tokens"):
        assert word in proc.stdout
    report = json.loads(out.read_text())
    meta, summary = report["meta"], report["summary"]
    assert meta["engine"]["name"] == "transformers"
    assert meta["sampling"] == {"temperature": 1.0, "top_p": 1.0, "max_tokens": 12, "samples": 2}
    assert meta["weight_version"] == 0 and meta["checkpoint"].endswith("tiny-arith")
    assert summary["tasks"] == 4 and summary["samples"] == 8 and summary["errors"] == 0
    assert set(summary["pass_at_k"]) == {"1", "2"}
    assert all(r["versions"] == [0] and 0 < r["tokens"] <= 12 for r in report["samples"])
