"""Runs that cannot train stop within ``run.stall_s`` with the cause named, and exit non-zero.

Real `astraflow train` runs on the CPU (real services, real episodes on the built-in tiny
policy), each broken the way a new user breaks one:

- constant reward: answers the policy can never write, so the zero-variance filter drops every
  group (reward 0.0 everywhere): without the stall check it sat at step 0 until ``--timeout``.

Mistakes the pre-flight finds (a misspelt workflow, env or model; an agent asking for a model
that is no role) are refused before any service starts, in seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
STALL_S = 6.0


def recipe(tmp_path: Path, *, sets: str = '[{ name = "arith", split = "train" }]',
           workflow: str = 'name = "single_agent"') -> Path:  # fmt: skip
    path = tmp_path / "r.toml"
    path.write_text(f"""
[run]
name = "stall"
output_dir = {json.dumps(str(tmp_path / "runs"))}
max_steps = 3
stall_s = {STALL_S}

[policies.policy]
model = "builtin:tiny-arith"
sampling = {{ temperature = 1.0, max_tokens = 4 }}
trainer = {{ loss_type = "dapo", groups_per_step = 2 }}

[tasks]
env = "astraflow/Math-v0"
group_size = 4
sets = {sets}

[workflow]
{workflow}
roles = {{ agent = "policy" }}

[dataflow]
policies = [{{ name = "zero_variance_filter" }}]

[rollout]
nodes = 1
concurrency = 8

[evaluation]
every_steps = 0
""")
    return path


def train(path: Path) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "astraflow.cli.main", "train", str(path), "--no-live", "--timeout", "400"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    return proc, time.monotonic() - started


def stopped_for(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 4, proc.stdout[-3000:] + proc.stderr[-3000:]
    err = " ".join(proc.stderr.split())
    assert "run stopped: no optimizer step for" in err and f"run.stall_s = {STALL_S:g}" in err
    return err


def test_constant_reward_stops_naming_the_reward_and_the_filter(tmp_path):
    rows = tmp_path / "train.jsonl"
    rows.write_text("".join(
        json.dumps({"question": f"{i}+1", "answer": "987654321987"}) + "\n" for i in range(40)
    ))  # fmt: skip
    sets = f'[{{ name = "jsonl", kwargs = {{ path = {json.dumps(str(rows))} }} }}]'
    proc, took = train(recipe(tmp_path, sets=sets))
    err = stopped_for(proc)
    assert "episodes had constant reward 0.0: nothing to learn from" in err
    assert "check the env's answer format" in err.replace("Check", "check")
    assert "remove the zero_variance filter" in err
    assert "first transcript:" in err
    # the plain status line showed the drops by reason in full
    assert "dropped policy: zero_variance" in proc.stdout
    assert "stopped cleanly" in proc.stdout and "services exited" not in proc.stdout
    assert took < 300


@pytest.mark.refused_before_start
@pytest.mark.parametrize(
    ("change", "named"),
    [
        (
            {"workflow": 'name = "single-agent"'},
            ["workflow.name: unknown workflow 'single-agent'", "did you mean single_agent"],
        ),
        ({"env": "astraflow/Maths-v0"}, ["astraflow/Maths-v0", "astraflow/Math-v0"]),
        ({"model": "builtin:tiny-arithm"}, ["policies.policy.model", "tiny-arithm"]),
    ],
    ids=["workflow", "env", "model"],
)
def test_a_misspelt_workflow_env_or_model_is_refused_before_start(tmp_path, change, named):
    """`train` runs every check `recipe check` runs before a service starts: a workflow typo
    ran 150 s and 123,164 failed episodes, a wrong env id 149 s; now seconds, naming the key and
    the fix, and no run directory is made."""
    path = recipe(tmp_path, **({"workflow": change["workflow"]} if "workflow" in change else {}))
    text = path.read_text()
    if "env" in change:
        text = text.replace('env = "astraflow/Math-v0"', f'env = "{change["env"]}"')
    if "model" in change:
        text = text.replace('model = "builtin:tiny-arith"', f'model = "{change["model"]}"')
    path.write_text(text)
    proc, took = train(path)
    err = " ".join(proc.stderr.split())
    assert proc.returncode == 1 and "problem" in err and "before start" in err, err[-2000:]
    for needle in named:
        assert needle in err, (needle, err[-2000:])
    assert took < 15 and not (tmp_path / "runs").exists()


@pytest.mark.refused_before_start
def test_agent_asking_for_an_unknown_model_is_refused_before_start(tmp_path):
    """An OpenAI-SDK agent that asks for a model that is no role: every call was answered 404
    until the stall check; the pre-flight reads the agent's model names and refuses the run."""
    agent = tmp_path / "agent.py"
    agent.write_text(
        "async def run(client, task):\n"
        "    r = await client.chat.completions.create(\n"
        '        model="gpt-4o-mini", messages=[{"role": "user", "content": task["question"]}])\n'
        "    return r.choices[0].message.content\n"
    )
    wf = f'name = "openai_agent"\nagent = {json.dumps(f"{agent}:run")}'
    proc, took = train(recipe(tmp_path, workflow=wf))
    err = " ".join(proc.stderr.split())
    assert proc.returncode == 1 and "before start" in err and "gpt-4o-mini" in err, err[-2000:]
    assert "workflow roles: agent" in err and took < 15
