"""`astraflow eval run --agent`: an OpenAI-SDK agent evaluated on the built-in policy; each sample's
decoded text is in the report; a run whose every sample failed exits non-zero."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "tests" / "rollout" / "openai_agents" / "arith_agent.py"


def eval_run(tmp_path: Path, agent: str, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "astraflow.cli.main", "eval", "run", "--policy", "builtin:tiny-arith",
         "--env", "astraflow/Math-v0", "--tasks", "arith:test", "--limit", "2",
         "--max-tokens", "8", "--device", "cpu", "--agent", agent, "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip


@pytest.mark.slow
def test_agent_runs_and_the_report_holds_each_samples_text(tmp_path):
    out = tmp_path / "report.json"
    proc = eval_run(tmp_path, f"{AGENT}:solve", out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["meta"]["workflow"] == "openai_agent"
    assert report["summary"]["errors"] == 0
    for row in report["samples"]:
        sources = [t["source"] for t in row["transcript"]]
        assert sources[0] == "context" and "policy" in sources
        policy_turn = next(t for t in row["transcript"] if t["source"] == "policy")
        assert policy_turn["role"] == "agent" and policy_turn["versions"] == [0]
        assert 0 < policy_turn["tokens"] <= 8 and isinstance(policy_turn["text"], str)
    # the question of the task is in the context the policy saw
    from astraflow.tasks.catalog import load_task_set

    question = load_task_set("arith", "test", limit=1)[0]["question"]
    texts = [t["text"] for r in report["samples"] for t in r["transcript"]]
    assert any(question in text for text in texts), texts


@pytest.mark.slow
def test_every_sample_failing_exits_nonzero(tmp_path):
    bad = tmp_path / "bad_agent.py"
    bad.write_text(
        "async def run(client, task):\n"
        "    r = await client.chat.completions.create(\n"
        '        model="gpt-4o-mini", messages=[{"role": "user", "content": task["question"]}])\n'
        "    return r.choices[0].message.content\n"
    )
    out = tmp_path / "report.json"
    proc = eval_run(tmp_path, f"{bad}:run", out)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    err = " ".join(proc.stderr.split())
    assert "every one of the 2 samples failed; the first:" in err and "gpt-4o-mini" in err
    assert json.loads(out.read_text())["summary"]["errors"] == 2  # the report is still written
