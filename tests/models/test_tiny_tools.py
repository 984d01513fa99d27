"""``builtin:tiny-tools``: committed, loadable, renders tools, and calls its calculator at the
documented starting rates (docs/tools.md), through the real hermes parser and ToolEnv."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from astraflow.tasks import calculator

from astraflow.models import BUILTIN_MODELS, load_model, load_tokenizer, resolve_model, tiny_tools
from astraflow.tools.parsers import get_tool_parser

CKPT = "builtin:tiny-tools"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(CKPT)


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return load_model(CKPT)


def test_committed_checkpoint_is_small_and_resolves():
    path = Path(resolve_model(CKPT))
    assert path == BUILTIN_MODELS["tiny-tools"].path
    assert (path / "model.safetensors").is_file()
    assert sum(p.stat().st_size for p in path.iterdir()) < 10 * 1024 * 1024


def test_template_renders_tools_calls_and_results(tokenizer):
    """What the model is trained on is what the tool_agent workflow and the gateway render."""
    from astraflow.tools.chat import render_chat, renders_tools

    assert renders_tools(tokenizer)
    messages = [
        {"role": "user", "content": "347*58"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "calculator",
                                      "arguments": '{"expression": "347*58"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "20126"},
    ]  # fmt: skip
    text = render_chat(tokenizer, messages, tools=[tiny_tools.CALCULATOR_SCHEMA])
    assert text == (
        "<|system|>tools: calculator(expression)<|end|><|user|>347*58<|end|><|assistant|>"
        + tiny_tools.call_text("347*58")
        + "<|end|><|tool|>20126<|end|><|assistant|>"
    )
    ids, mask = tiny_tools.encode_episode(
        tokenizer, tiny_tools.episode(__import__("random").Random(0), _problem("347*58"), "call")
    )
    assert tokenizer.decode(ids) == text + "20126<|end|>"
    trained = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert trained == tiny_tools.call_text("347*58") + "<|end|>20126<|end|>"


def _problem(question: str) -> dict:
    a, b = question.split("*")
    return {"question": question, "answer": str(int(a) * int(b))}


def test_schema_matches_the_tool_function():
    from transformers.utils import get_json_schema

    schema = get_json_schema(calculator.calculator)
    assert schema["function"]["name"] == tiny_tools.TOOL_NAME
    assert list(schema["function"]["parameters"]["properties"]) == ["expression"]


def test_greedy_episode_is_a_parseable_correct_call(model, tokenizer):
    parser = get_tool_parser("hermes")
    problems = calculator.generate("test")[:8]
    prompts = [tiny_tools.prompt_ids(tokenizer, p["question"]) for p in problems]
    first = tiny_tools.decode(model, tokenizer, prompts, tiny_tools.CALL_TOKENS, 0.0, 0)
    for ids, p in zip(first, problems, strict=True):
        turn = parser.parse(tokenizer.decode(ids, skip_special_tokens=True), ids)
        assert turn.valid and len(turn.calls) == 1, turn
        assert turn.calls[0].name == "calculator"
        assert turn.calls[0].arguments == {"expression": p["question"]}


def test_sampled_rates_are_in_the_documented_band(model, tokenizer):
    """Seeded sampling (T=1) on 128 held-out problems: the starting point RL learns from."""
    rates = tiny_tools.tool_use_rates(model, tokenizer, calculator.generate("test")[:128], seed=0)
    assert 0.25 <= rates.success <= 0.55, rates
    assert 0.30 <= rates.correct_call <= 0.60, rates
    assert 0.10 <= rates.no_call <= 0.40, rates
    assert 0.15 <= rates.other_call <= 0.45, rates
    # the copy skill: nearly every correct call is answered with the tool's result
    assert rates.success >= 0.8 * rates.correct_call, rates
    assert rates.success <= rates.correct_call


def test_episodes_through_tool_agent_and_tool_env(model, tokenizer):
    """The real path: transformers engine, tool_agent workflow, hermes parser, ToolEnv."""
    from astraflow.rollout.engines import make_engine
    from astraflow.rollout.evaluation.agents import EngineAgent
    from astraflow.rollout.evaluation.tasksets import TaskSetEval, evaluate_task_set

    engine = make_engine("transformers", resolve_model(CKPT))
    agent = EngineAgent(engine, max_tokens=100, temperature=1.0, tool_parser="hermes")
    config = TaskSetEval(
        env="astraflow/Tools-v0", task_set="calculator", limit=24, samples=2, max_turns=2,
        workflow="tool_agent", concurrency=48,
        env_kwargs={"tools": ["astraflow.tasks.calculator:calculator"]},
    )  # fmt: skip

    async def run():
        try:
            return await evaluate_task_set(agent, config)
        finally:
            await agent.close()

    report = asyncio.run(run())
    rows = report["samples"]
    assert len(rows) == 48 and report["summary"]["errors"] == 0
    finishes = {r["finish_reason"] for r in rows}
    assert "terminated" in finishes, finishes  # answered after a call, or without one
    assert any(r["success"] for r in rows) and not all(r["success"] for r in rows)
    assert any(r["tool_calls"] > 0 and r["success"] for r in rows)


def test_calculator_tool():
    assert calculator.calculator("347*58") == "20126"
    assert calculator.calculator("(2+3)*4-7//2%3") == str((2 + 3) * 4 - 7 // 2 % 3)
    assert calculator.calculator("2**10").startswith("error: unsupported element")
    assert calculator.calculator("__import__('os')").startswith("error:")
    assert calculator.calculator("1/0").startswith("error:")
    assert calculator.calculator("7 //0").startswith("error:")
    assert calculator.calculator("3*(4").startswith("error: not an arithmetic expression")
    assert calculator.calculator("9" * 70).startswith("error: expression longer")


def test_task_set_splits_are_disjoint_and_seeded():
    test = calculator.generate("test")
    train = calculator.generate("train", size=2000)
    assert len(test) == 500 and len({p["question"] for p in test}) == 500
    assert not {p["question"] for p in test} & {p["question"] for p in train}
    assert calculator.generate("train", size=50) == calculator.generate("train", size=50)
    assert calculator.generate("train", size=50, seed=1) != calculator.generate("train", size=50)
    for p in test[:50]:
        assert calculator.calculator(p["question"]) == p["answer"]
    with pytest.raises(ValueError, match="split"):
        calculator.generate("validation")


@pytest.mark.slow
def test_build_is_deterministic(tmp_path):
    import hashlib

    a = tiny_tools.build(tmp_path / "a", seed=3, steps=3, eval_size=8)
    b = tiny_tools.build(tmp_path / "b", seed=3, steps=3, eval_size=8)
    assert a.steps == 3 and a.final_loss is not None

    def digest(p: Path) -> str:
        return hashlib.sha256((p / "model.safetensors").read_bytes()).hexdigest()

    assert digest(a.out_dir) == digest(b.out_dir)
    from astraflow.cli.main import app
    from typer.testing import CliRunner

    args = ["models", "build", "tiny-tools", "--seed", "3", "--steps", "3", "--eval-size", "8"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    assert "sampled (T=1) on calculator test" in result.output
    assert digest(tmp_path / "c") == digest(a.out_dir)


def test_recipe_check_passes():
    from astraflow.cli.main import app
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["recipe", "check", "recipes/tools_calculator.toml"])
    assert result.exit_code == 0, result.output
    from astraflow.recipe import load_recipe

    recipe = load_recipe(Path(__file__).resolve().parents[2] / "recipes" / "tools_calculator.toml")
    policy = recipe.policies["policy"]
    assert policy.model == CKPT and policy.tool_parser == "hermes"
    assert recipe.workflow.name == "tool_agent" and recipe.tasks.env == "astraflow/Tools-v0"
    assert recipe.tasks.env_kwargs["tools"] == ["astraflow.tasks.calculator:calculator"]
