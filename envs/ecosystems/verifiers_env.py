"""``verifiers:NAME``: an installed verifiers environment, through its own ``load_environment()``.

A verifiers environment is a package (``pip install`` or Prime's hub) whose module ``NAME``
exposes ``load_environment(**kwargs) -> vf.Environment``: a dataset of chat prompts, a rollout
loop (``SingleTurnEnv``, ``MultiTurnEnv.env_response``, ``ToolEnv`` with Python tools) and a
rubric that scores a finished rollout. This adapter runs the environment's *own* rollout loop
(``Environment.run_rollout``: its stop conditions, its env responses, its tools, its rubric) and
puts AstraFlow's policy where verifiers expects a model client: every model call the loop makes
becomes one turn of the AstraFlow episode.

How: verifiers asks its ``Client`` for each model response. :class:`_TurnClient` is such a
client; instead of calling an API it hands the prompt (chat messages, plus the tools offered) to
the env's caller and waits for the action. So ``reset`` starts the rollout and returns the first
prompt (``info["messages"]``, ``info["tools"]`` for a tool env); ``step(action)`` answers the
pending model call with the action (text, or tool calls from the function-calling path) and returns
what the environment said next (its ``env_response`` messages, e.g. ``tool`` results, as
``info["messages"]`` and ``info["tool_messages"]``), or, when the rollout ended, the rubric's
reward with ``terminated``. Text envs run under ``single_agent``, tool envs under ``tool_agent``
(the policy's chat template renders the tools, its tool parser reads the calls).

The environment is loaded once per process (it serves many rollouts at once, as in verifiers)
and its dataset is the task set ``verifiers`` (:func:`astraflow.tasks.ecosystems.verifiers_rows`). The
sampling settings verifiers passes are ignored: the policy's own (``policies.NAME.sampling``)
apply. Requires verifiers' classic environment API (``vf.Environment``, verifiers < 0.4).
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import signal
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from astraflow.envs.base import TaskError, TextEnv, fit_text
from astraflow.envs.ecosystems import require
from astraflow.envs.ecosystems.messages import messages_text
from astraflow.envs.tools.env import answer_of, tool_calls_of

from astraflow.errors import AstraFlowError

#: the model name the adapter's client is called with (verifiers logs it; nothing routes on it)
MODEL = "astraflow-policy"


class VerifiersError(AstraFlowError, RuntimeError):
    """A verifiers environment that cannot run under AstraFlow as it is (names why)."""


# ---------------------------------------------------------------------------- loading


class _SignalsKept:
    """Stands in for the ``signal`` module inside verifiers' environment module.

    Why: constructing a ``vf.Environment`` installs SIGINT/SIGTERM handlers for its own teardown,
    which would take Ctrl-C away from the AstraFlow service it runs in (a rollout node stops in
    order on SIGTERM) and fails outright off the main thread (envs are built in the node's env
    pool). Its handlers are not installed; the rest of the module is the real one."""

    def __init__(self, module: Any):
        self._module = module

    def signal(self, signum: int, handler: Any) -> Any:  # noqa: ARG002 - kept, not installed
        return self._module.getsignal(signum)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


_LOAD_LOCK = threading.Lock()
_LOADED: dict[tuple[str, str], Any] = {}


def _keep_signals(vf: Any) -> None:
    import sys

    module = sys.modules.get(vf.Environment.__module__)
    if module is not None and getattr(module, "signal", None) is signal:
        module.signal = _SignalsKept(signal)


def load(name: str, env_args: Mapping[str, Any] | None = None) -> Any:
    """The verifiers environment ``name`` (``vf.load_environment(name, **env_args)``), loaded once
    per process and argument set."""
    vf = require("verifiers")
    args = dict(env_args or {})
    key = (name, json.dumps(args, sort_keys=True, default=str))
    with _LOAD_LOCK:
        if key not in _LOADED:
            if not hasattr(vf, "Environment") or not hasattr(vf, "load_environment"):
                raise VerifiersError(
                    f"verifiers:{name}: the installed verifiers "
                    f"{getattr(vf, '__version__', '?')} has no classic environment API "
                    "(vf.Environment, vf.load_environment); install verifiers < 0.4"
                )
            _keep_signals(vf)
            try:
                _LOADED[key] = vf.load_environment(name, **args)
            except ValueError as exc:  # verifiers' "Could not import ..."
                raise VerifiersError(
                    f"verifiers:{name}: {exc} (the environment's package must be installed on "
                    "every rollout node and where the task set loads, e.g. pip install it)"
                ) from exc
    return _LOADED[key]


def jsonable(value: Any) -> Any:
    """A dataset value as plain JSON (messages, info dicts), so a row can travel as a payload."""
    return json.loads(json.dumps(value, default=str))


def dataset_rows(env: Any, split: str, n: int = -1, seed: int | None = None) -> list[dict]:
    """The environment's own dataset (``train``) or evaluation dataset (any other split)."""
    ds = (
        env.get_dataset(n=n, seed=seed)
        if split == "train"
        else env.get_eval_dataset(n=n, seed=seed)
    )
    return [jsonable(dict(row)) for row in ds]


# ---------------------------------------------------------------------------- messages


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        text = part.get("text") if isinstance(part, Mapping) else getattr(part, "text", None)
        if text:
            parts.append(str(text))
    return "\n".join(parts)


def _field(message: Any, name: str) -> Any:
    return message.get(name) if isinstance(message, Mapping) else getattr(message, name, None)


def to_openai(message: Any) -> dict[str, Any]:
    """A verifiers message (pydantic or dict) as an OpenAI chat message with text content."""
    role = _field(message, "role")
    out: dict[str, Any] = {"role": "user" if role == "text" else role}
    out["content"] = _content_text(_field(message, "content"))
    if role == "tool":
        out["tool_call_id"] = str(_field(message, "tool_call_id") or "")
    calls = _field(message, "tool_calls")
    if role == "assistant" and calls:
        out["tool_calls"] = [
            {
                "id": str(_field(c, "id")),
                "type": "function",
                "function": {"name": _field(c, "name"), "arguments": _field(c, "arguments")},
            }
            for c in calls
        ]
    return out


def tool_schema(tool: Any) -> dict[str, Any]:
    """A ``vf.Tool`` as an OpenAI ``tools`` entry (what the chat template renders)."""
    return {
        "type": "function",
        "function": {
            "name": _field(tool, "name"),
            "description": _field(tool, "description") or "",
            "parameters": _field(tool, "parameters") or {"type": "object", "properties": {}},
        },
    }


# ---------------------------------------------------------------------------- the model seam


class _Call:
    """One model call of the rollout, waiting for the policy's action."""

    def __init__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None):
        self.messages = messages
        self.tools = tools
        self.reply: asyncio.Future = asyncio.get_running_loop().create_future()


@functools.cache
def _client_class(vf: Any) -> type:
    from verifiers.clients.client import Client

    class TurnClient(Client):
        """A ``vf`` client whose "model" is the AstraFlow episode: each call waits for a turn."""

        def __init__(self, calls: asyncio.Queue):
            super().__init__(calls)

        def setup_client(self, config):  # never built from a config
            raise VerifiersError("the AstraFlow turn client takes no ClientConfig")

        async def to_native_tool(self, tool):
            return tool_schema(tool)

        async def to_native_prompt(self, messages):
            return [to_openai(m) for m in messages], {}

        async def get_native_response(self, prompt, model, sampling_args, tools=None, **kwargs):
            call = _Call(prompt, tools or None)
            await self.client.put(call)
            return await call.reply

        async def raise_from_native_response(self, response):
            return None

        async def from_native_response(self, response):
            text, calls = response
            vf_calls = [
                vf.ToolCall(id=c.id, name=c.name, arguments=c.arguments_json()) for c in calls
            ] or None
            message = vf.ResponseMessage(
                content=text,
                tool_calls=vf_calls,
                finish_reason="tool_calls" if vf_calls else "stop",
                is_truncated=False,
            )
            return vf.Response(
                id=f"astraflow-{uuid.uuid4().hex[:12]}",
                created=int(time.time()),
                model=MODEL,
                message=message,
            )

        async def close(self):
            return None

    return TurnClient


# ---------------------------------------------------------------------------- the env


class VerifiersEnv(TextEnv):
    family = "verifiers"
    description = "An installed verifiers environment by its name (load_environment())"
    action_format = "The environment's (its prompt says); a tool env takes tool calls"
    reward_doc = (
        "The environment's rubric score of the finished rollout (weighted reward functions), "
        "on the turn that ends it; 0.0 before"
    )
    task_fields = {
        "prompt": "Chat messages opening the rollout (a row of the environment's dataset)",
        "example_id": "optional: the row's example id",
        "answer": "optional: the reference answer the rubric reads",
        "info": "optional: the row's info dict",
        "task": "optional: the row's task name",
    }

    def __init__(self, env_name: str, max_turns: int = 1, render_mode: str | None = None,
                 **env_args: Any):  # fmt: skip
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        self._vf = require("verifiers")
        self.env_name = env_name
        self.env_args = env_args
        self.vf_env = load(env_name, env_args)
        self._client_cls = _client_class(self._vf)
        self._rollout: asyncio.Task | None = None
        self._calls: asyncio.Queue | None = None
        self._pending: _Call | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # sync callers' private loop
        self._sample_rows: list[dict] | None = None

    # ------------------------------------------------------------------ tasks
    def sample_task(self, rng) -> dict[str, Any]:
        if self._sample_rows is None:
            self._sample_rows = dataset_rows(self.vf_env, "train", n=16)
        row = dict(self._sample_rows[int(rng.integers(0, len(self._sample_rows)))])
        row.setdefault("id", f"{self.env_name}/sample-{row.get('example_id', 0)}")
        return row

    # ------------------------------------------------------------------ async protocol
    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        await self.aclose()
        task = (options or {}).get("task")
        if task is None:
            task = self.sample_task(random_generator(seed))
        if not isinstance(task, dict):
            raise TaskError(f"verifiers:{self.env_name}: options['task'] must be a dict")
        self.validate_task(task)
        if not isinstance(task["prompt"], list) or not task["prompt"]:
            raise TaskError(f"verifiers:{self.env_name}: 'prompt' must be a non-empty message list")
        self.task, self.turn = task, 0
        row = {k: v for k, v in task.items() if k != "id"}
        row.setdefault("example_id", 0)
        self._calls = asyncio.Queue()
        client = self._client_cls(self._calls)
        self._rollout = asyncio.ensure_future(self.vf_env.run_rollout(row, client, MODEL, {}))
        event = await self._next()
        if not isinstance(event, _Call):
            raise VerifiersError(
                f"verifiers:{self.env_name}: the rollout ended before asking the model anything "
                f"(reward {event.get('reward')!r}, error {event.get('error')!r})"
            )
        self._pending = event
        messages = event.messages
        if messages[-1]["role"] != "user" or any(
            m["role"] not in ("system", "user", "assistant") for m in messages
        ):
            raise VerifiersError(
                f"verifiers:{self.env_name}: a rollout must open with system/user/assistant "
                "messages ending with a user turn"
            )
        info: dict[str, Any] = {"messages": [dict(m) for m in messages]}
        if event.tools:
            info["tools"] = event.tools
        obs = fit_text(messages_text(messages[-1:]), self.observation_space.max_length)
        self._last_obs = obs
        return obs, info

    async def astep(self, action: Any):
        if self._pending is None:
            raise VerifiersError(f"verifiers:{self.env_name}: step() before reset()")
        call = self._pending
        self._pending = None
        calls = tool_calls_of(action) or []
        text = answer_of(action) if not isinstance(action, str) else action
        call.reply.set_result((text, calls))
        self.turn += 1
        sent = [*call.messages, to_openai(self._reply_message(text, calls))]
        event = await self._next()
        if isinstance(event, _Call):
            new = event.messages[len(sent) :]
            if len(event.messages) <= len(sent) or not _continues(event.messages, sent):
                raise VerifiersError(
                    f"verifiers:{self.env_name}: the environment's next prompt does not continue "
                    "its conversation (earlier messages changed); AstraFlow grows one token "
                    "sequence per episode and cannot train on a rewritten history"
                )
            self._pending = event
            info: dict[str, Any] = {"messages": new, "tool_messages": new}
            obs = fit_text(messages_text(new), self.observation_space.max_length)
            truncated = self.turn >= self.max_turns
            if truncated:
                info["success"] = False
            self._last_obs = obs
            return obs, 0.0, False, truncated, info
        reward = float(event.get("reward") or 0.0)
        threshold = float(getattr(self.vf_env, "pass_threshold", 0.5))
        info = {
            "reward": reward,
            "success": reward >= threshold,
            "metrics": {k: float(v) for k, v in (event.get("metrics") or {}).items()},
            "stop_condition": event.get("stop_condition"),
        }
        error = event.get("error")
        if error:
            info["error"] = str(error.get("message") if isinstance(error, Mapping) else error)
        self._rollout = None
        self._last_obs = ""
        return "", reward, True, False, info

    async def aclose(self) -> None:
        task, self._rollout, self._pending = self._rollout, None, None
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except BaseException:  # noqa: BLE001 - a cancelled rollout's end is of no interest
                pass

    async def _next(self) -> _Call | dict:
        """The rollout's next model call, or its output once it has ended (scored)."""
        assert self._calls is not None and self._rollout is not None
        getter = asyncio.ensure_future(self._calls.get())
        done, _ = await asyncio.wait({getter, self._rollout}, return_when=asyncio.FIRST_COMPLETED)
        if getter in done:
            return getter.result()
        getter.cancel()
        return dict(self._rollout.result())

    @staticmethod
    def _reply_message(text: str, calls: Sequence[Any]) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            msg["tool_calls"] = [
                {"id": c.id, "name": c.name, "arguments": c.arguments_json()} for c in calls
            ]
        return msg

    # ------------------------------------------------------------------ the Gymnasium API
    def _run(self, coro):
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(coro)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super(TextEnv, self).reset(seed=seed)
        if options is None or options.get("task") is None:
            options = {**(options or {}), "task": self.sample_task(self.np_random)}
        return self._run(self.areset(seed=seed, options=options))

    def step(self, action: Any):
        return self._run(self.astep(action))

    def close(self):
        if self._loop is not None:
            self._loop.run_until_complete(self.aclose())
            self._loop.close()
            self._loop = None


def _continues(messages: list[dict[str, Any]], sent: list[dict[str, Any]]) -> bool:
    """Whether ``messages`` start with what was sent so far (roles and text)."""
    return all(
        m.get("role") == s.get("role") and m.get("content", "") == s.get("content", "")
        for m, s in zip(messages, sent, strict=False)
    )


def random_generator(seed: int | None):
    import numpy as np

    return np.random.default_rng(seed if seed is not None else random.randrange(2**31))
