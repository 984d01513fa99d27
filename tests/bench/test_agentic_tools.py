"""The agentic bench's ``tools`` case without a training run: TRL's own function-calling path
(``GRPOTrainer(tools=...)``) renders and parses the tiny tools policy exactly as AstraFlow does,
its tool waits the recipe's latency, its reward scores only a final answer, TRL's tool loop runs
real calls on the built-in policy, the held-out metric plays real tool episodes, and the case's
analysis and report (``bench/agentic.py``, ``_trl_tools.py``)."""

from __future__ import annotations

import asyncio
import inspect
import json
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import _evaluation  # noqa: E402
import _records  # noqa: E402
import _results  # noqa: E402
import _trl_tools  # noqa: E402

QUESTION, ANSWER = "347*582", "201954"
CALCULATOR = ["astraflow.tasks.calculator:calculator"]


@pytest.fixture(scope="module")
def agentic():
    import agentic as module

    return module


@pytest.fixture(scope="module")
def tokenizer():
    from astraflow.models import load_tokenizer, resolve_model

    tok = load_tokenizer(resolve_model("builtin:tiny-tools"))
    tok.padding_side = "left"
    return tok


def _no_delay():
    from astraflow.envs.wrappers.latency import LatencyDistribution

    return LatencyDistribution("fixed", {"value_s": 0.0})


def _call_text(tokenizer) -> str:
    """An assistant turn calling the calculator, as the policy's chat template writes it."""
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": QUESTION}}}  # fmt: skip
    user = [{"role": "user", "content": QUESTION}]
    prompt = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    whole = tokenizer.apply_chat_template(
        [*user, {"role": "assistant", "content": "", "tool_calls": [call]}], tokenize=False
    )
    assert whole.startswith(prompt)
    return whole[len(prompt) :]


def test_trl_renders_and_parses_the_tiny_tools_policy_as_astraflow_does(tokenizer):
    from astraflow.tasks.calculator import calculator
    from trl.chat_template_utils import (
        add_response_schema,
        is_chat_template_prefix_preserving,
        parse_response,
        supports_tool_calling,
    )

    from astraflow.rollout.workflows.tokens import ChatRenderer
    from astraflow.tools.parsers import get_tool_parser
    from astraflow.tools.schema import function_schema

    # TRL's checks for its native tool loop pass; its response parsers know only published
    # templates, which is why the bench sets RESPONSE_TEMPLATE on the tokenizer
    assert supports_tool_calling(tokenizer) and is_chat_template_prefix_preserving(tokenizer)
    with pytest.raises(ValueError, match="Unrecognized chat template"):
        add_response_schema(tokenizer)
    tokenizer.response_template = _trl_tools.RESPONSE_TEMPLATE

    tool = _trl_tools.latency_tool(calculator, _no_delay(), 0, [])
    user = [{"role": "user", "content": QUESTION}]
    trl_prompt = tokenizer.apply_chat_template(
        user, tools=[tool], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    ours = ChatRenderer(tokenizer, tools=[function_schema(calculator)]).prompt_ids(QUESTION)
    assert list(trl_prompt) == ours  # token for token

    hermes = get_tool_parser("hermes")
    text = _call_text(tokenizer)
    ids = tokenizer.encode(text, add_special_tokens=False)
    parsed = parse_response(tokenizer, ids, prefix=ours, tools=[tool])
    (trl_call,) = parsed["tool_calls"]
    (af_call,) = hermes.parse(text.removesuffix(tokenizer.eos_token)).calls
    assert trl_call["function"] == {"name": af_call.name, "arguments": af_call.arguments}
    assert af_call.arguments == {"expression": QUESTION}

    answer = parse_response(tokenizer, tokenizer.encode(ANSWER + "<|end|>"), prefix=ours)
    assert answer == {"role": "assistant", "content": ANSWER}
    assert _trl_tools.final_answer([answer]) == ANSWER

    # a call whose JSON is broken: AstraFlow ends the episode (invalid_tool_call), TRL keeps the
    # raw text as content, which the bench's reward treats as no answer
    broken = text.replace("}}", "}", 1)
    assert not hermes.parse(broken.removesuffix(tokenizer.eos_token)).valid
    fallback = parse_response(tokenizer, tokenizer.encode(broken, add_special_tokens=False))
    assert "tool_calls" not in fallback and "<tool_call>" in fallback["content"]
    assert _trl_tools.final_answer([fallback]) is None


def test_latency_tool_keeps_the_schema_and_waits_each_call():
    from astraflow.envs.wrappers.latency import LatencyDistribution
    from astraflow.tasks.calculator import calculator

    from astraflow.tools.schema import function_schema

    delays: list[float] = []
    dist = LatencyDistribution("fixed", {"value_s": 0.05})
    tool = _trl_tools.latency_tool(calculator, dist, 0, delays)
    assert inspect.iscoroutinefunction(tool)  # TRL gathers it on its event loop
    assert function_schema(tool) == function_schema(calculator)
    started = time.perf_counter()
    assert asyncio.run(tool(expression="2*3")) == "6"
    assert time.perf_counter() - started >= 0.05 and delays == [0.05]
    # the lognormal stream is seeded: the same seed draws the same delays
    lognormal = LatencyDistribution.from_config({"p50_s": 0.001, "p99_s": 0.002})
    a, b = [], []
    for out in (a, b):
        t = _trl_tools.latency_tool(calculator, lognormal, 3, out)
        for _ in range(3):
            asyncio.run(t(expression="1+1"))
    assert a == b and len(set(a)) == 3


def test_reward_scores_only_a_final_answer():
    score = _evaluation.env_scorer("astraflow/Tools-v0", {"tools": CALCULATOR})
    reward = _trl_tools.reward_function(score)
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": QUESTION}}}  # fmt: skip
    called = {"role": "assistant", "content": "", "tool_calls": [call]}
    result = {"role": "tool", "name": "calculator", "content": ANSWER}
    completions = [
        [called, result, {"role": "assistant", "content": ANSWER}],  # call, then the answer
        [called, result, {"role": "assistant", "content": "123"}],  # a wrong answer
        [called, result],  # no answer: the generation after the tool was cut off
        [{"role": "assistant", "content": '<tool_call>{"name": "calculator"</tool_call>'}],
        [{"role": "assistant", "content": ANSWER}],  # answered without the tool
    ]
    prompts = [[{"role": "user", "content": QUESTION}]] * len(completions)
    assert reward(prompts, completions, [ANSWER] * len(completions)) == [1.0, 0.0, 0.0, 0.0, 1.0]


def test_trl_tool_loop_runs_the_calculator_on_the_builtin_policy(agentic, tokenizer, tmp_path):
    """TRL's own generation and tool loop, no optimizer step: calls parsed by TRL reach the
    latency tool, its results come back as tool messages masked out of the loss."""
    import _trl as T
    import torch
    from astraflow.tasks.calculator import calculator
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOTrainer

    from astraflow.models import resolve_model

    settings = agentic.tools_case_settings([], True, 1, 1)
    tokenizer.response_template = _trl_tools.RESPONSE_TEMPLATE
    delays: list[float] = []
    tool = _trl_tools.latency_tool(calculator, _no_delay(), 0, delays)
    model = AutoModelForCausalLM.from_pretrained(
        resolve_model("builtin:tiny-tools"), dtype=torch.float32
    )
    config = T.grpo_config(settings, seed=0, steps=1, out=tmp_path)
    config.max_tool_calling_iterations = settings["max_turns"] - 1
    rows = [{"prompt": [{"role": "user", "content": QUESTION}], "answer": ANSWER}] * 8
    trainer = GRPOTrainer(
        model=model, reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
        args=config, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
        tools=[tool],
    )  # fmt: skip
    seen = []
    generate = trainer._generate

    def recorded(prompts):  # TRL's own _generate, its output kept for the assertions
        seen.append(generate(prompts))
        return seen[-1]

    trainer._generate = recorded
    torch.manual_seed(0)
    trainer._generate_and_score_completions(rows)  # generation, tool loop, rewards; no step
    _p, _ids, tool_mask, completions, *_ = seen[0]
    tool_turns = [m for c in completions for m in c if m["role"] == "tool"]
    assert tool_turns and len(delays) == len(tool_turns)
    assert any(m["content"] == ANSWER for m in tool_turns)  # a right call, run by TRL
    masked = [i for i, c in enumerate(completions) if any(m["role"] == "tool" for m in c)]
    assert all(0 in tool_mask[i] for i in masked)  # the tool's tokens are not trained


def test_tool_accuracy_plays_real_tool_episodes(tokenizer):
    """The held-out metric runs the calls: the policy cannot multiply 3-digit numbers itself, so
    any success means a call ran and its result was read back."""
    import torch
    from astraflow.tasks.catalog import load_task_set
    from transformers import AutoModelForCausalLM

    from astraflow.models import resolve_model

    model = AutoModelForCausalLM.from_pretrained(
        resolve_model("builtin:tiny-tools"), dtype=torch.float32
    )
    problems = load_task_set("calculator", "test", seed=0, limit=8)
    kw = {"env": "astraflow/Tools-v0", "env_kwargs": {"tools": CALCULATOR}}
    greedy = _evaluation.tool_accuracy(model, tokenizer, problems, 100, **kw)
    assert 0.0 < greedy <= 1.0
    # no second turn: the call's result is never answered, nothing succeeds
    assert _evaluation.tool_accuracy(model, tokenizer, problems, 100, max_turns=1, **kw) == 0.0
    settings = {"env": "astraflow/Tools-v0", "env_kwargs": {"tools": CALCULATOR}}
    assert _evaluation.accuracy_function(settings).func is _evaluation.tool_accuracy
    assert _evaluation.accuracy_function({"env": "astraflow/Math-v0"}) is (
        _evaluation.greedy_accuracy
    )


def test_tools_case_settings_read_the_recipe(agentic):
    s = agentic.tools_case_settings(["tasks.env_latency.p99_s=2.0"], True, 2, 1)
    assert s["case"] == "tools" and s["env"] == "astraflow/Tools-v0"
    assert s["model"] == "builtin:tiny-tools" and s["tool_parser"] == "hermes"
    assert s["max_turns"] == 2 and s["env_kwargs"]["tools"] == CALCULATOR
    assert s["env_latency"]["on"] == ["tool_calls"] and s["env_latency"]["p99_s"] == 2.0
    assert (s["eval_every"], s["eval_temperature"]) == (2, 1.0)


def _run(system: str, train_s: float, accs: tuple[float, float], seed: int = 0, **extra):
    res = _results.PolicyResult("policy", steps=2, trained_samples=128, train_s=train_s,
                                samples_per_s=128 / train_s, idle_fraction=0.5, extra=extra)  # fmt: skip
    res.evals = [_records.EvalPoint(0, 0.0, accs[0]), _records.EvalPoint(2, train_s, accs[1])]
    run = _results.RunResult(system, seed, True, train_s + 10, startup_s=5.0, t0=0.0)
    run.policies["policy"] = res
    return run


def test_tools_analysis_and_report(agentic):
    runs = [
        _run("trl", 100.0, (0.10, 0.14), env_wait_s_per_step=40.0, tool_calls_per_step=30.0),
        _run("astraflow_sync", 50.0, (0.10, 0.15), episodes_in_flight_mean=64),
        _run("astraflow_async", 20.0, (0.10, 0.13), episodes_in_flight_mean=200),
    ]
    failed = _results.RunResult("trl", 1, False, 5.0, error="boom")
    summary = agentic.analyse_tools([*runs, failed], {"case": "tools"})
    assert summary["speedup_vs_trl"] == pytest.approx(5.0)
    assert summary["speedup_async_over_sync"] == pytest.approx(2.5)
    assert summary["speedup_sync_vs_trl"] == pytest.approx(2.0)
    assert summary["trl"]["runs"] == 1 and summary["trl"]["tool_wait_s_per_step"] == 40.0
    assert summary["astraflow_sync"]["final_acc"] == 0.15
    assert summary["astraflow_async"]["acc_before"] == 0.10
    assert summary["astraflow_async"]["samples_per_s"] == pytest.approx(6.4)
    agentic.print_tools_report(summary, [*runs, failed])
    json.dumps(summary)
