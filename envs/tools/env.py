"""``astraflow/Tools-v0``: function calling over Python functions a recipe names.

Recipe::

    [tasks]
    env = "astraflow/Tools-v0"
    env_kwargs = { tools = ["my_pkg.tools:search", "my_pkg.tools:open"] }

The tools' JSON schemas come from their signatures and docstrings (:mod:`astraflow.tools.schema`)
and are offered to the model in the reset ``info["tools"]``. An action is either tool calls (a
list of :class:`~astraflow.tools.calls.ToolCall`, a :class:`~astraflow.tools.calls.ParsedTurn`
with calls, or an assistant message dict with OpenAI ``tool_calls``): the env runs them and answers
with one ``tool`` message per call (``info["tool_messages"]``; the observation is their text); or
text: the final answer, scored by the task's reward and ending the episode.

Where calls run: with only sync tools the env has no async methods, so the node runs ``step`` in
its env pool; with an async tool it has ``astep`` (sync tools then run in a worker thread, async
ones on the loop). Either way the node bounds each step by ``rollout.env_timeout_s``. A tool that
raises, an unknown tool name or arguments that do not fit the signature become the text of that
call's tool message (the model sees the error), never an episode failure.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from astraflow.envs.base import StateMixin, TaskError, TextEnv

from astraflow.tools.calls import ParsedTurn, ToolCall
from astraflow.tools.schema import FunctionTool, load_tools

#: ``reward(answer, task) -> float | bool`` for ToolEnv's ``reward`` kwarg.
RewardFn = Callable[[str, dict[str, Any]], Any]


def tool_calls_of(action: Any) -> list[ToolCall] | None:
    """The calls an action asks for, or None when the action is a final answer (text)."""
    if isinstance(action, str):
        return None
    if isinstance(action, ParsedTurn):
        return list(action.calls) or None
    if isinstance(action, ToolCall):
        return [action]
    if isinstance(action, Mapping):
        entries = action.get("tool_calls") or []
        return [ToolCall.from_openai(dict(e)) for e in entries] or None
    if isinstance(action, Sequence) and all(isinstance(c, ToolCall) for c in action):
        return list(action) or None
    raise TypeError(
        "a ToolEnv action is the final answer (str) or tool calls (list[ToolCall], a ParsedTurn, "
        f"or {{'tool_calls': [...]}}), got {type(action).__name__}"
    )


def answer_of(action: Any) -> str:
    if isinstance(action, ParsedTurn):
        return action.content
    if isinstance(action, Mapping):
        return str(action.get("content") or "")
    return action if isinstance(action, str) else ""


def result_text(value: Any) -> str:
    """A tool's return value as the text of its tool message."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def _load_reward(ref: str | RewardFn) -> RewardFn:
    from astraflow.tools.schema import _import

    return _import(ref) if isinstance(ref, str) else ref


class ToolEnv(StateMixin, TextEnv):
    """Tools are Python functions; the final answer is scored by ``reward`` or ``score_env``.

    Saves its state between turns (the task, the turn, the calls made so far), so a tool episode
    resumes on another node (``tool_agent``, docs/elastic.md). That assumes what the tools did is
    not part of the episode's state: true of pure functions (a calculator, a lookup) and of
    read-only services; a tool that changes the world an episode later reads back needs an env
    whose state holds that world, or one that does not save (``MCPEnv``)."""

    family: ClassVar[str] = "tools"
    description: ClassVar[str] = (
        "Function calling: the recipe's Python functions as tools, the final answer scored by "
        "the task's reward"
    )
    action_format: ClassVar[str] = (
        "Tool calls (OpenAI tool_calls, parsed from the model's text by the policy's tool_parser) "
        "run the tools and come back as tool messages; a turn without calls is the final answer."
    )
    reward_doc: ClassVar[str] = (
        "The final answer's score: reward(answer, task) when the recipe names a reward function, "
        "else one step of score_env (default astraflow/Math-v0) reset with the task. 0.0 for tool "
        "turns; 0.0 and success False when max_turns pass without an answer. info: tools (reset), "
        "tool_messages (after calls), tool_calls (count), answer, success."
    )
    task_fields: ClassVar[dict[str, str]] = {
        "question": "the user's request (str)",
        "answer": "optional reference answer, for the reward",
    }

    def __init__(
        self,
        tools: Sequence[str | Callable[..., Any]] = (),
        reward: str | RewardFn | None = None,
        score_env: str = "astraflow/Math-v0",
        score_env_kwargs: dict[str, Any] | None = None,
        max_turns: int = 4,
        max_result_chars: int = 4096,
        system_prompt: str | None = None,
        render_mode: str | None = None,
    ):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        self.tools: dict[str, FunctionTool] = {t.name: t for t in load_tools(list(tools))}
        self.reward_fn = _load_reward(reward) if reward is not None else None
        self.score_env_id = score_env
        self.score_env_kwargs = dict(score_env_kwargs or {})
        self.max_result_chars = max_result_chars
        self.system_prompt = system_prompt
        self.tool_calls = 0
        if any(t.is_async for t in self.tools.values()):
            self.astep = self._astep  # async tools run on the node's loop, see the module doc

    # ------------------------------------------------------------------ what the model is offered
    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        """The OpenAI ``tools`` entries (rendered by the chat template)."""
        return [t.schema for t in self.tools.values()]

    def sample_task(self, rng) -> dict[str, Any]:
        a, b = (int(x) for x in rng.integers(100, 1000, size=2))
        return {"question": f"What is {a}*{b}?", "answer": str(a * b)}

    def _reset_task(self, task: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if not isinstance(task.get("question"), str):
            raise TaskError(f"ToolEnv: task['question'] must be a string, got {task!r:.120}")
        self.tool_calls = 0
        info: dict[str, Any] = {"tools": self.tool_schemas}
        if self.system_prompt:
            info["system_prompt"] = self.system_prompt
        return task["question"], info

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "tool_calls": int(self.tool_calls)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.tool_calls = self._saved_count(state, "tool_calls")

    # ------------------------------------------------------------------ running calls
    def _prepare(self, call: ToolCall) -> tuple[FunctionTool, dict[str, Any]] | str:
        tool = self.tools.get(call.name)
        if tool is None:
            return f"error: no tool named {call.name!r}; tools: {', '.join(self.tools)}"
        try:
            inspect.signature(tool.fn).bind(**call.arguments)
        except TypeError as exc:
            return f"error: {call.name}: {exc}"
        return tool, call.arguments

    def _message(self, call: ToolCall, text: str) -> dict[str, Any]:
        if len(text) > self.max_result_chars:
            text = text[: self.max_result_chars] + " [... truncated]"
        return {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": text}

    def call_tool(self, call: ToolCall) -> dict[str, Any]:
        """Run one call here (a thread of the env pool); its tool message."""
        prepared = self._prepare(call)
        if isinstance(prepared, str):
            return self._message(call, prepared)
        tool, args = prepared
        try:
            value = tool.fn(**args)
            if inspect.isawaitable(value):
                value = asyncio.run(_awaited(value))
        except Exception as exc:  # noqa: BLE001 - the model sees what its call did
            return self._message(call, f"error: {type(exc).__name__}: {exc}")
        return self._message(call, result_text(value))

    async def acall_tool(self, call: ToolCall) -> dict[str, Any]:
        """Run one call from the event loop: async tools awaited, sync ones in a thread."""
        prepared = self._prepare(call)
        if isinstance(prepared, str):
            return self._message(call, prepared)
        tool, args = prepared
        try:
            if tool.is_async:
                value = await tool.fn(**args)
            else:
                value = await asyncio.to_thread(tool.fn, **args)
        except Exception as exc:  # noqa: BLE001
            return self._message(call, f"error: {type(exc).__name__}: {exc}")
        return self._message(call, result_text(value))

    # ------------------------------------------------------------------ the Gymnasium API
    def _step_text(self, action: Any) -> tuple[str, float, bool, dict[str, Any]]:
        raise AssertionError("ToolEnv overrides step")  # pragma: no cover

    def step(self, action: Any):
        calls = tool_calls_of(action)
        if calls is None:
            return self._finish(self._score(answer_of(action)))
        return self._after_calls([self.call_tool(c) for c in calls])

    async def _astep(self, action: Any):
        calls = tool_calls_of(action)
        if calls is None:
            return self._finish(await asyncio.to_thread(self._score, answer_of(action)))
        return self._after_calls(list(await asyncio.gather(*(self.acall_tool(c) for c in calls))))

    def _after_calls(self, messages: list[dict[str, Any]]):
        self.turn += 1
        self.tool_calls += len(messages)
        obs = "\n".join(m["content"] for m in messages)
        truncated = self.turn >= self.max_turns
        info: dict[str, Any] = {"tool_messages": messages, "tool_calls": self.tool_calls}
        if truncated:
            info["success"] = False
        self._last_obs = obs
        return obs, 0.0, False, truncated, info

    def _finish(self, scored: tuple[float, dict[str, Any]]):
        self.turn += 1
        reward, info = scored
        info = {**info, "tool_calls": self.tool_calls}
        info.setdefault("success", reward >= 1.0)
        self._last_obs = ""
        return "", float(reward), True, False, info

    def _score(self, answer: str) -> tuple[float, dict[str, Any]]:
        if self.reward_fn is not None:
            value = self.reward_fn(answer, dict(self.task))
            return float(value), {"answer": answer}
        from astraflow.envs.registry import make_env

        env = make_env(self.score_env_id, **self.score_env_kwargs)
        try:
            env.reset(options={"task": dict(self.task)})
            _obs, reward, _term, _trunc, info = env.step(answer)
        finally:
            env.close()
        return float(reward), {"answer": answer, **_flat(info)}


async def _awaited(value: Any) -> Any:
    return await value


def _flat(info: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in info.items() if isinstance(v, (str, int, float, bool))}
