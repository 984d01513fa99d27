"""The TRL side of the agentic bench's ``tools`` case: ``trl.GRPOTrainer`` running its *own*
function-calling loop (``GRPOTrainer(tools=[...])``) on the built-in tiny tools policy.

What TRL does natively (trl 1.16, ``grpo_trainer.py``), and what this module supplies:

* prompts are rendered by ``apply_chat_template(prompt, tools=trainer.tools)``: the tiny policy's
  template renders the calculator as ``<|system|>tools: calculator(expression)<|end|>``, token for
  token the prompt AstraFlow's ``ChatRenderer`` renders (a test checks it);
* each generated turn is parsed by ``trl.chat_template_utils.parse_response``, i.e. the
  tokenizer's ``response_template`` (transformers' response parsing). TRL's
  ``add_response_schema`` sets one only for the published templates it knows (Qwen, Llama 3,
  GPT-OSS, ...) and refuses the tiny policy's, so :data:`RESPONSE_TEMPLATE` is set on the
  tokenizer here, as TRL's error message asks: hermes ``<tool_call>{json}</tool_call>`` blocks,
  ``<|end|>`` ending the turn. A block that is not valid JSON falls back (TRL's own fallback) to
  plain content that still holds ``<tool_call>``: scored 0, as AstraFlow's ``invalid_tool_call``;
* the calls run in TRL's ``_tool_call_loop``, the tool results are appended as tokens
  (``_get_tool_suffix_ids``, masked out of the loss) and the model generates again, up to
  ``max_tool_calling_iterations`` (the recipe's ``max_turns - 1``) rounds.

The tool is :func:`astraflow.tasks.calculator.calculator` behind the recipe's latency distribution
(:func:`latency_tool`: the same :class:`~astraflow.envs.wrappers.latency.LatencySampler`, one draw per call,
an ``asyncio.sleep``), async so that TRL gathers a sample's calls on its event loop. TRL's loop
still awaits one sample's calls before it runs the next sample's (``.result()`` inside the loop
over samples), so a step's tool time is the *sum* of its calls' delays: that is TRL's tool loop as
shipped, and what this case measures.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import time
from collections.abc import Callable
from typing import Any

import _evaluation
import _trl as T

#: transformers ``response_template`` for the tiny tools policy's chat template (hermes calls).
RESPONSE_TEMPLATE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|assistant|>",
    "fields": {
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|end\|>\s*", "content": "text"},
    },
}


def latency_tool(
    fn: Callable[..., Any], distribution, seed: int, calls: list[float]
) -> Callable[..., Any]:
    """``fn`` as an async tool that first waits a delay drawn from ``distribution`` (a
    :class:`~astraflow.envs.wrappers.latency.LatencyDistribution`; stream ``(seed, "trl")``), keeping
    ``fn``'s name, signature and docstring (TRL and AstraFlow derive the same JSON schema from
    them). Each call's delay is appended to ``calls``."""
    import numpy as np
    from astraflow.envs.wrappers.latency import LatencySampler, stream_id

    sampler = LatencySampler(
        distribution, np.random.SeedSequence(seed, spawn_key=(stream_id("trl"),))
    )

    @functools.wraps(fn)
    async def tool(*args: Any, **kwargs: Any) -> Any:
        delay = sampler.draw()
        calls.append(delay)
        await asyncio.sleep(delay)
        return fn(*args, **kwargs)

    return tool


def final_answer(messages: list[dict[str, Any]]) -> str | None:
    """The episode's final answer in TRL's parsed completion (its list of messages), or None
    when it has none: the last assistant turn still calls a tool (the turn limit passed) or holds
    a call that did not parse (TRL kept its raw text as content)."""
    turns = [m for m in messages if m.get("role") == "assistant"]
    if not turns:
        return None
    last = turns[-1]
    content = last.get("content") or ""
    if last.get("tool_calls") or "<tool_call>" in content:
        return None
    return content


def reward_function(score: Callable[[str, str, str], float]) -> Callable[..., list[float]]:
    """TRL reward: the env's score of the final answer (``score(question, answer, text)``, the
    recipe's ``astraflow/Tools-v0`` grading it through ``astraflow/Math-v0``), 0 without one."""

    def tool_reward(prompts, completions, answer, **_: Any) -> list[float]:
        out = []
        for prompt, messages, reference in zip(prompts, completions, answer, strict=True):
            text = final_answer(messages)
            question = prompt[-1]["content"]
            out.append(0.0 if text is None else float(score(question, reference, text)))
        return out

    tool_reward.__name__ = "tool_reward"
    return tool_reward


def trl_tools_worker(ns: argparse.Namespace) -> None:
    """Stock ``trl.GRPOTrainer`` with ``tools=[calculator behind the latency]``; AstraFlow-format
    metrics (steps, held-out evaluations, tool wait) as every TRL run of the benches."""
    from astraflow.envs.wrappers.latency import LatencyDistribution

    from astraflow.tools.schema import load_tool

    w = T.Worker.start(ns)
    cfg = w.cfg
    w.tokenizer.response_template = RESPONSE_TEMPLATE
    latency = {k: v for k, v in (cfg.get("env_latency") or {}).items() if v is not None}
    dist = LatencyDistribution.from_config(
        {k: v for k, v in latency.items() if k not in ("on", "inner", "seed")}
        or {"distribution": "fixed", "value_s": 0.0}
    )
    delays: list[float] = []
    tools = [
        latency_tool(load_tool(ref).fn, dist, ns.seed, delays)
        for ref in cfg["env_kwargs"].get("tools") or []
    ]
    score = _evaluation.env_scorer(cfg["env"], cfg["env_kwargs"])
    rows = [
        {"prompt": [{"role": "user", "content": t["question"]}], "answer": t["answer"]}
        for t in w.train_tasks
    ]
    started = time.perf_counter()

    def step_fields() -> dict[str, Any]:
        # TRL runs the calls one sample after another: its tool wall time is the delays' sum
        return {"env_wait_s_total": sum(delays), "tool_calls_total": len(delays)}

    def info_fields() -> dict[str, Any]:
        return {"tool_delays_s": delays, "worker_s": time.perf_counter() - started}

    w.train(
        rows, [reward_function(score)], step_fields=step_fields, info_fields=info_fields,
        tools=tools,
        config_overrides={"max_tool_calling_iterations": max(1, cfg["max_turns"] - 1)},
    )  # fmt: skip
