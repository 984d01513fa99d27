"""`astraflow recipe check` resolves what a run would only find out on its nodes: the workflow
name, the agent's model names (they must be roles) and an evaluation split that is the training
data. Each case fails the check with the key and the fix named, before anything starts."""

from __future__ import annotations

import json
from pathlib import Path

from astraflow.cli.main import app
from typer.testing import CliRunner

BASE = '[policies.policy]\nmodel = "builtin:tiny-arith"\n'


def check(tmp_path: Path, body: str) -> tuple[int, str]:
    recipe = tmp_path / "r.toml"
    recipe.write_text(BASE + body)
    result = CliRunner().invoke(app, ["recipe", "check", str(recipe)])
    return result.exit_code, " ".join((result.stdout + (result.stderr or "")).split())


def test_workflow_typo_fails_with_the_close_name(tmp_path):
    code, out = check(tmp_path, '[workflow]\nname = "single-agent"\n')
    assert code == 1
    assert "workflow.name: unknown workflow 'single-agent'; did you mean single_agent" in out
    ok, _ = check(tmp_path, '[workflow]\nname = "single_agent"\n')
    assert ok == 0


def test_agent_model_name_that_is_no_role(tmp_path):
    agent = tmp_path / "agent.py"
    agent.write_text(
        "async def run(client, payload):\n"
        "    r = await client.chat.completions.create(\n"
        '        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])\n'
        "    return r.choices[0].message.content\n"
    )
    body = f'[workflow]\nname = "openai_agent"\nagent = {json.dumps(f"{agent}:run")}\n'
    code, out = check(tmp_path, body)
    assert code == 1
    assert "asks for model(s) 'gpt-4o-mini'" in out and "workflow roles: agent" in out
    agent.write_text(agent.read_text().replace("gpt-4o-mini", "agent"))
    assert check(tmp_path, body)[0] == 0


def test_evaluation_on_the_training_file_is_named(tmp_path):
    rows = tmp_path / "train.jsonl"
    rows.write_text("".join(json.dumps({"question": f"{i}+1", "answer": str(i + 1)}) + "\n"
                            for i in range(3)))  # fmt: skip
    sets = (
        f'[tasks]\nsets = [{{ name = "jsonl", kwargs = {{ path = {json.dumps(str(rows))} }} }}]\n'
    )
    code, out = check(tmp_path, sets)
    assert code == 1
    assert "evaluation 'jsonl' (split 'test')" in out and "would be the training data" in out
    assert "put {split} in the path" in out
    # the same check for any set whose evaluation split loads the training rows
    (tmp_path / "test.jsonl").write_text(rows.read_text())
    pattern = json.dumps(str(tmp_path / "{split}.jsonl"))
    code, out = check(
        tmp_path, f'[tasks]\nsets = [{{ name = "jsonl", kwargs = {{ path = {pattern} }} }}]\n'
    )
    assert code == 1 and "is the training data (the same rows as the training set 'jsonl')" in out
    code, _ = check(tmp_path, sets + "[evaluation]\nevery_steps = 0\n")
    assert code == 0


def test_agent_callable_that_does_not_resolve(tmp_path):
    missing = f'[workflow]\nname = "openai_agent"\nagent = "{tmp_path}/nope.py:run"\n'
    code, out = check(tmp_path, missing)
    assert code == 1 and "cannot import" in out and "nope.py" in out
    (tmp_path / "agent.py").write_text("async def run(client, payload):\n    return 0.0\n")
    wrong_name = f'[workflow]\nname = "openai_agent"\nagent = "{tmp_path}/agent.py:solve"\n'
    code, out = check(tmp_path, wrong_name)
    assert code == 1 and "has no attribute 'solve'" in out
