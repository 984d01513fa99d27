"""``tool_agent``: the function-calling loop of one policy on the engine, token-exact.

Each turn: the engine generates; the policy's tool parser (``policies.NAME.tool_parser``) reads the
turn; calls go to the env (``await env.step(calls)``, e.g. ``astraflow/Tools-v0`` or
``astraflow/MCP-v0``), whose ``info["tool_messages"]`` are rendered with the chat template and
appended as tokens to the same sequence (the conversation is never re-rendered, so the generated
ids stay exactly as generated); a turn without calls is the final answer the env scores.

The tools the model is offered are the env's (reset ``info["tools"]``, OpenAI schemas), rendered
into the prompt by the chat template (``apply_chat_template(..., tools=...)``, or AstraFlow's
hermes-style default for templates that have no tools support).

``tool_choice`` (workflow kwarg) forces a call on the first turn, as the OpenAI field does: a
tool name, or ``"required"``; the call's opening is prefilled as context (the whole call for a tool
without parameters, see :func:`astraflow.tools.chat.forced_call_prefix`), later turns are free. It
lets a policy that has not learnt to call tools yet still exercise them.

Resumable (``saver``, see :class:`~astraflow.rollout.workflows.base.EpisodeSaver`): after each
tool turn the episode can be saved (the sequence so far, the env's state, the tools offered) and
goes on from there on another node, when the env saves its state (``Tools-v0`` does; an MCP
server's world cannot be saved, so ``MCP-v0`` episodes are played again).

How an episode ends (``finish_reason``): ``terminated`` (the env scored the answer),
``truncated`` (the env's turn limit), ``turn_limit`` (``max_turns`` without an answer), ``length``
(the sequence reached ``min(max_total_tokens, engine context - 1)``: the next tool results are not
appended when they do not fit), ``invalid_tool_call`` (a call that did not parse; reward 0,
counted in ``metrics["invalid_tool_calls"]``, the reason in ``info["invalid_tool_call"]``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from astraflow.protocol import Episode, Task
from astraflow.rollout.workflows.base import (
    EnvFactory,
    EpisodeSaver,
    RolePolicy,
    WorkflowError,
    WorkflowSpec,
)
from astraflow.rollout.workflows.budget import context_limit
from astraflow.rollout.workflows.single_agent import (
    TurnRecorder,
    _jsonable,
    resume_saved,
    sampling_for,
    save_turn,
)
from astraflow.rollout.workflows.tokens import ChatRenderer
from astraflow.tools.calls import INVALID_TOOL_CALL
from astraflow.tools.chat import forced_call_prefix
from astraflow.tools.parsers import turn_text


async def tool_agent(
    task: Task,
    policies: Mapping[str, RolePolicy],
    make_env: EnvFactory,
    *,
    max_turns: int = 4,
    max_total_tokens: int = 4096,
    system_prompt: str | None = None,
    tool_choice: str | None = None,
    saver: EpisodeSaver | None = None,
    **env_kwargs: Any,
) -> Episode:
    if "agent" not in policies:
        raise WorkflowError(f"tool_agent needs the role 'agent'; got roles {sorted(policies)}")
    agent = policies["agent"]
    parser = agent.parser()
    tok = agent.tokenizer
    env = await make_env(task.env, {"max_turns": max_turns, **env_kwargs})
    started = time.perf_counter()
    gen_s = env_s = 0.0
    calls_made = invalid = 0
    try:
        t0 = time.perf_counter()
        resumed = await resume_saved(saver, env, _read_state)
        if resumed is not None:
            rec, saved, first_turn = resumed
            total_reward, calls_made, tools, system, end_info = saved
            prefill = ""  # a forced call is the first turn's, played before the save
        else:
            obs, info = await env.reset(seed=None, options={"task": task.payload})
            tools = info.get("tools") or None
            system = system_prompt or info.get("system_prompt")
            total_reward, first_turn, end_info = 0.0, 0, {}
        env_s += time.perf_counter() - t0
        renderer = ChatRenderer(tok, system=system, tools=tools)
        if resumed is None:
            rec = TurnRecorder("agent", renderer.prompt_ids(obs, info.get("messages")))
            try:
                prefill = forced_call_prefix(parser, tools or [], tool_choice)
            except ValueError as exc:
                raise WorkflowError(f"workflow.kwargs.tool_choice: {exc}") from None
        budget = context_limit(agent.engine, max_total_tokens)
        params = sampling_for(task, agent)
        finish = "turn_limit"
        for index in range(first_turn, max_turns):
            if prefill:  # a forced first call: its opening is given, not generated
                rec.add_context(tok.encode(prefill, add_special_tokens=False))
            room = budget - len(rec.tokens)
            if room <= 0:
                finish = "length"
                break
            t0 = time.perf_counter()
            (gen,) = await agent.engine.generate(
                rec.tokens, replace(params, max_tokens=min(params.max_tokens, room))
            )
            gen_s += time.perf_counter() - t0
            rec.add_generated(gen.token_ids, gen.logprobs, gen.version)
            turn = parser.parse(prefill + turn_text(tok, gen.token_ids, parser), gen.token_ids)
            prefill = ""
            if not turn.valid:
                invalid += 1
                finish = INVALID_TOOL_CALL
                end_info = {"invalid_tool_call": turn.error, "success": False}
                break
            t0 = time.perf_counter()
            if turn.calls:
                calls_made += len(turn.calls)
                obs, reward, terminated, truncated, info = await env.step(list(turn.calls))
            else:
                obs, reward, terminated, truncated, info = await env.step(turn.content)
            env_s += time.perf_counter() - t0
            total_reward += reward
            rec.add_turn_reward(float(reward))
            end_info = info
            if terminated:
                finish = "terminated"
                break
            if truncated:
                finish = "truncated"
                break
            messages = info.get("tool_messages") or [{"role": "user", "content": obs}]
            feedback = renderer.messages_ids(messages, gen.token_ids)
            if len(rec.tokens) + len(feedback) >= budget:  # no room to answer after it
                finish = "length"
                break
            rec.add_context(feedback)
            if saver is not None:
                await save_turn(
                    saver, rec, env, index + 1,
                    lambda last=end_info, reward_so_far=total_reward, calls=calls_made: {
                        "total_reward": reward_so_far,
                        "tool_calls": calls,
                        "tools": tools,
                        "system": system,
                        "info": _jsonable(_without_messages(last)),
                    },
                )  # fmt: skip
        end_info = _without_messages(end_info)
        return Episode(
            task_id=task.id,
            trajectories=[rec.trajectory()],
            rewards={"agent": total_reward},
            finish_reason=finish,
            info=_jsonable(end_info),
            metrics={
                "generate_s": gen_s,
                "env_s": env_s,
                "wall_s": time.perf_counter() - started,
                "turns": float(rec.turns),
                "tokens": float(len(rec.tokens)),
                "tool_calls": float(calls_made),
                "invalid_tool_calls": float(invalid),
                # turns played by an earlier node and resumed here, not played again
                "resumed_turns": float(first_turn),
            },
        )
    finally:
        await env.close()


def _without_messages(info: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in info.items() if k != "tool_messages"}


def _read_state(state: dict[str, Any]):
    """``tool_agent``'s own part of a save (see :func:`resume_saved`)."""
    tools = state["tools"]
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
    ):
        raise TypeError(f"saved tools must be a list of schemas, got {type(tools).__name__}")
    system = state["system"]
    if system is not None and not isinstance(system, str):
        raise TypeError(f"saved system prompt must be a string, got {type(system).__name__}")
    float(state["total_reward"])  # checked, not carried: rewards come from this node's env
    return (
        0.0,
        int(state["tool_calls"]),
        tools,
        system,
        dict(state.get("info") or {}),
    )


SPEC = WorkflowSpec(
    "tool_agent",
    tool_agent,
    ("agent",),
    "One policy calling the env's tools (function calling), token-exact over turns",
    resumable=True,
)
