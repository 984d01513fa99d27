"""Who acts in an evaluation: an inference engine, or a script speaking through an engine.

Both hand the workflow :class:`RolePolicy` objects, so episodes run the same way either way:

* :class:`EngineAgent` serves every episode from one real engine (transformers, vLLM, OpenAI), as a
  rollout node does;
* :class:`ScriptedAgent` builds a :class:`ScriptedEngine` per episode from the task (e.g. a
  benchmark's reference solutions), which is how it knows which episode it is answering.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from astraflow.protocol import Task
from astraflow.rollout.engines.base import SamplingParams
from astraflow.rollout.engines.scripted import ScriptedEngine
from astraflow.rollout.workflows.base import RolePolicy

OVERFLOW_MODES = ("limit", "truncate")


class EngineAgent:
    """One engine for all episodes.

    ``overflow``: ``limit`` (a conversation that outgrows the model's context ends; AgentBench's
    "agent context limit") or ``truncate`` (the model sees only the latest tokens that fit; for
    small-context models, not benchmark-faithful; see :mod:`..engines.window`).
    """

    def __init__(
        self,
        engine: Any,
        *,
        name: str = "policy",
        role: str = "agent",
        max_tokens: int = 512,
        temperature: float = 0.0,
        overflow: str = "limit",
        top_p: float = 1.0,
        tool_parser: str = "auto",
    ):
        if overflow not in OVERFLOW_MODES:
            raise ValueError(f"overflow must be 'limit' or 'truncate', got {overflow!r}")
        if overflow == "truncate":
            from astraflow.rollout.engines.window import SlidingWindowEngine

            engine = SlidingWindowEngine(engine)
        self.name = name
        self.engine = engine
        #: The workflow's token budget per episode: the model's context (or unbounded when the
        #: engine slides a window over long prompts).
        self.max_total_tokens = int(getattr(engine, "max_context", 0) or 1 << 30)
        self.sampling = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens)
        self._policies = {
            role: RolePolicy(name, engine, self.sampling, trainable=False, tool_parser=tool_parser)
        }

    def policies(self, task: Task) -> dict[str, RolePolicy]:
        return self._policies

    async def close(self) -> None:
        await self.engine.close()


class ScriptedAgent:
    """A fresh scripted engine per episode; ``script_for(task)`` returns ``observation -> reply``."""

    max_total_tokens = 1 << 30

    def __init__(
        self,
        name: str,
        script_for: Callable[[Task], Callable[[str], str]],
        *,
        role: str = "agent",
        max_tokens: int = 1 << 16,
    ):
        self.name = name
        self.role = role
        self.script_for = script_for
        self.params = SamplingParams(temperature=0.0, max_tokens=max_tokens)

    def policies(self, task: Task) -> dict[str, RolePolicy]:
        engine = ScriptedEngine(self.script_for(task))
        return {self.role: RolePolicy(self.name, engine, self.params, trainable=False)}

    async def close(self) -> None:
        return None
