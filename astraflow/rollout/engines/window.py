"""An engine wrapper that feeds a model only the latest tokens of prompts longer than its context.

Why: small-context models (the built-in 256-token starter policy) cannot hold a multi-turn
AgentBench conversation. Benchmarks normally end such an episode (AgentBench's "agent context
limit"); for smoke-testing small models, ``astraflow eval agentbench --overflow truncate`` keeps the
episode going by letting the model see the most recent tokens only. The workflow still records the
whole conversation; only what the model conditions on is cut.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from astraflow.rollout.engines.base import Generation, SamplingParams, WeightUpdate


class SlidingWindowEngine:
    """Wraps ``engine``; a prompt that leaves under 2 tokens of room keeps its last tokens only,
    leaving room for ``min(max_tokens, reserve)`` new ones."""

    def __init__(self, engine: Any, max_context: int | None = None, reserve: int = 64):
        self.engine = engine
        self.window = int(max_context or getattr(engine, "max_context", 0) or 0)
        if self.window < 2:
            raise ValueError(
                "SlidingWindowEngine needs the model's context size: pass max_context or wrap an "
                "engine with a max_context attribute"
            )
        self.reserve = reserve
        #: To the workflow the conversation is unbounded; the window applies inside generate.
        self.max_context = 1 << 30

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def version(self) -> int:
        return self.engine.version

    def fit(
        self, prompt_ids: list[int], params: SamplingParams
    ) -> tuple[list[int], SamplingParams]:
        """The prompt as the model sees it and the sampling params that fit beside it."""
        prompt = list(prompt_ids)
        room = self.window - len(prompt)
        if room < 2:
            keep = max(1, self.window - min(params.max_tokens, self.reserve))
            prompt = prompt[-keep:]
            room = self.window - len(prompt)
        return prompt, replace(params, max_tokens=max(1, min(params.max_tokens, room - 1)))

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Generation]:
        prompt, params = self.fit(prompt_ids, params)
        return await self.engine.generate(prompt, params)

    async def load_weights(self, update: WeightUpdate) -> None:
        await self.engine.load_weights(update)

    async def close(self) -> None:
        await self.engine.close()
