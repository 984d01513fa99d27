"""Tool-calling and agent front-ends, with ONE real training run for the trainer side they share.

The trainer cannot tell how an episode was produced: a sample is tokens, a loss mask, logprobs
and rewards. So one run trains for real (the ``openai_agent`` workflow, an agent written with the
``openai`` SDK that reports a reward per call, ``trainer.turn_discount``, the held-out evaluation
through the agent too), and every other front-end is shown to produce trainable samples by
``astraflow eval run``, which runs its episodes through the rollout node's own path (workflow,
engine, gateway, env runner; tests/rollout/test_eval_tasksets.py):

* ``tool_agent`` + hermes calls over ``astraflow/Tools-v0`` (a Python function) and over
  ``astraflow/MCP-v0`` (a real MCP server over stdio), the tool really running in every episode;
* ``recipes/tools_calculator.toml``'s set-up (tiny-tools, hermes, the calculator tool);
* an ``openai`` SDK agent (one call per episode) and an OpenAI Agents SDK ``Agent`` with a
  ``@function_tool`` (the forced call, the tool's result, one more turn for the answer).

The tiny policy was never taught to call tools, so ``tool_choice`` names a parameterless tool: its
call is given whole on the first turn, the tool runs (its log says so), its result is appended as
tokens and the policy answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
sys.path.insert(0, str(TESTS / "tools"))
from quickstart_run import TWO_SMALL_STEPS, QuickstartRun, train_quickstart  # noqa: E402

from astraflow.dataflow.storage import history  # noqa: E402

pytestmark = pytest.mark.slow

AGENTS = TESTS / "rollout" / "openai_agents"
CALC = TESTS / "tools" / "calc_tools.py"
#: a reward the untrained tiny policy's answers vary on (is it a number?), so groups are not all 0
REWARD = f"{CALC}:is_number"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> QuickstartRun:
    """An AReaL-style agent reports a reward per call (client.set_reward); the samples keep them
    per turn and the trainer credits each turn with its discounted return."""
    pytest.importorskip("openai", reason="the openai SDK is in the test extra")
    return train_quickstart(
        tmp_path_factory.mktemp("openai-agent"),
        [
            "workflow.name=openai_agent",
            f"workflow.agent={json.dumps(str(AGENTS / 'arith_agent.py') + ':rewarded_turns')}",
            "policies.policy.trainer.turn_discount=0.9",
            # every episode's total is the same (0.25 + 0.5 + 1.0): only the turns differ
            'dataflow.policies=[{ name = "staleness", kwargs = { max_staleness = 2 } }]',
            *TWO_SMALL_STEPS,
            "evaluation.every_steps=2",
            "evaluation.num_tasks=8",
        ],
    )


def test_an_openai_sdk_agent_trains_the_builtin_policy(run):
    assert run.step_versions == [1, 2]
    evals = [r for r in run.records if r.get("type") == "eval"]
    assert evals, "the held-out evaluation ran through the agent too"
    # (its score is the episodes' mean reward: 0.25 + 1.5 per episode here)
    assert all(e["n"] == 8 and e["errors"] == 0 for e in evals), evals
    assert evals[-1]["version"] == 2  # the trained weights were evaluated
    episodes = run.episodes()
    errors = [info for reason, info in episodes if reason == "error"]
    assert episodes and not errors, errors[:3]
    # every episode came through the agent's SDK calls, and the trained samples carry its tokens
    assert all(info["metrics"].get("calls") == 2.0 for _, info in episodes), episodes[:3]
    samples = [r for r in run.read(history.samples) if r.policy == "policy"]
    assert samples and sum(r.n_tokens for r in samples) > 0
    assert any(r.batch_id for r in samples)  # served to the trainer


def test_per_call_rewards_train_with_turn_discount(run):
    kept = [json.loads(r.turn_rewards) for r in run.read(history.samples)]
    assert kept and all(k == [0.25, 1.5] for k in kept), kept[:3]
    # the trainer took steps on them: with one advantage per sample these groups carry none
    losses = [r["metrics"].get("loss") for r in run.records if r.get("type") == "step"]
    assert all(loss is not None and loss != 0.0 for loss in losses), run.records


def eval_run(tmp_path: Path, policy: str, env: str, tasks: str, *extra: str,
             environ: dict[str, str] | None = None, n: int = 8) -> list[dict]:  # fmt: skip
    """``astraflow eval run`` (sampled at temperature 1, as training samples): its rows."""
    out = tmp_path / "report.json"
    argv = [sys.executable, "-m", "astraflow.cli.main", "eval", "run", "--policy", policy,
            "--env", env, "--tasks", tasks, "--limit", str(n), "--temperature", "1.0",
            "--device", "cpu", "--out", str(out), *extra]  # fmt: skip
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "200", **(environ or {})})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = report["samples"]
    assert len(rows) == n and report["summary"]["errors"] == 0, rows[:2]
    # trainable: every episode generated tokens (loss mask 1) at the policy's weight version
    assert all(r["tokens"] > 0 and r["versions"] == [0] for r in rows), rows[:2]
    return rows


def _tool_agent_rows(tmp_path: Path, env: str, *env_kwargs: str) -> list[dict]:
    log = tmp_path / "tool.log"
    rows = eval_run(
        tmp_path, "builtin:tiny-arith", env, "arith:test",
        "--workflow", "tool_agent", "--tool-parser", "hermes", "--max-turns", "3",
        "--max-tokens", "12", "--env-kwarg", "tool_choice=hint",
        "--env-kwarg", f"reward={REWARD}", *env_kwargs,
        environ={"ASTRAFLOW_TEST_TOOL_LOG": str(log)},
    )  # fmt: skip
    # env_timeout: a server start past the env timeout on a loaded machine (no sample)
    scored = [r for r in rows if r["finish_reason"] not in ("error", "env_timeout")]
    assert scored and all(r["tool_calls"] >= 1 for r in scored), rows[:3]
    assert len(log.read_text().splitlines()) >= len(scored)  # the tool ran in every episode
    return rows


def test_tool_env_with_python_function_tools_makes_trainable_episodes(tmp_path):
    tools = json.dumps([f"{CALC}:hint"])
    _tool_agent_rows(tmp_path, "astraflow/Tools-v0", "--env-kwarg", f"tools={tools}")


def test_mcp_env_with_an_mcp_servers_tools_makes_trainable_episodes(tmp_path):
    pytest.importorskip("mcp", reason="the mcp SDK is in the test extra")
    args = [str(TESTS / "tools" / "mcp_calc_server.py"), str(tmp_path / "tool.log")]
    server = json.dumps({"command": sys.executable, "args": args})
    _tool_agent_rows(tmp_path, "astraflow/MCP-v0", "--env-kwarg", f"server={server}",
                     "--env-kwarg", 'tools=["hint"]')  # fmt: skip


def test_tools_calculator_recipe_s_episodes_hold_whole_tool_calls(tmp_path):
    """recipes/tools_calculator.toml's policy, env, tools and task set (its trainer side is the
    one the training run above exercises)."""
    rows = eval_run(
        tmp_path, "builtin:tiny-tools", "astraflow/Tools-v0", "calculator:test",
        "--workflow", "tool_agent", "--tool-parser", "hermes", "--max-turns", "2",
        "--max-tokens", "100", "--env-kwarg", 'tools=["astraflow.tasks.calculator:calculator"]',
    )  # fmt: skip
    # the sequences hold whole tool-call episodes: a call (~80 tokens) plus the answer
    assert sum(r["tokens"] for r in rows) / len(rows) > 20, rows[:2]
    assert 0.0 <= sum(r["success"] for r in rows) / len(rows) <= 1.0


def test_an_openai_sdk_agent_makes_trainable_episodes(tmp_path):
    pytest.importorskip("openai", reason="the openai SDK is in the test extra")
    rows = eval_run(tmp_path, "builtin:tiny-arith", "astraflow/Math-v0", "arith:test",
                    "--agent", f"{AGENTS / 'arith_agent.py'}:solve", "--max-tokens", "8")  # fmt: skip
    assert all(r["turns"] == 1 for r in rows)  # one SDK call, one trajectory turn


def test_an_agents_sdk_agent_with_a_function_tool_makes_trainable_episodes(tmp_path):
    pytest.importorskip("agents", reason="openai-agents is in the test extra")
    log = tmp_path / "tool_calls.log"
    rows = eval_run(tmp_path, "builtin:tiny-arith", "astraflow/Math-v0", "arith:test",
                    "--agent", f"{AGENTS / 'sdk_agent.py'}:solve", "--max-tokens", "8",
                    environ={"ASTRAFLOW_TEST_TOOL_LOG": str(log)})  # fmt: skip
    # every episode: the forced call, the tool's result, one more model turn for the answer
    assert all(r["tool_calls"] == 1 and r["turns"] == 2 for r in rows), rows[:3]
    assert {r["finish_reason"] for r in rows} <= {"terminated", "length"}
    assert len(log.read_text().splitlines()) == len(rows)  # the tool ran each time
