"""The inference-engine interface every rollout backend implements.

Token-in/token-out: engines take prompt token ids and return generated token ids with the per-token
log-probs of the sampling distribution (after temperature, as the trainer computes them), so the
trainer never re-tokenizes. Engines are asyncio-friendly: many episodes await ``generate`` at once and
an engine may batch them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from astraflow.errors import AstraFlowError

# New weights for an engine: a full state (name -> tensor) or a sparse delta from ``parent``
# (``delta.apply_(tensors)`` in place, between generations). One class shared with the weights
# component, so what a node fetches goes straight to ``engine.load_weights``.
from astraflow.weights.update import WeightUpdate

__all__ = ["Engine", "EngineDeadError", "Generation", "SamplingParams", "WeightUpdate"]


class EngineDeadError(AstraFlowError, RuntimeError):
    """The engine itself is gone (closed, its worker or server died): no request on it can succeed.

    Backends raise a subclass, so the rollout node tells a dead engine (stop taking work) from a
    failed request (score the episode 0) by class, without importing any backend."""


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 32
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    #: Keep generating past the model's end-of-sequence token (benchmarks; vLLM's ``ignore_eos``).
    ignore_eos: bool = False
    #: Scheduling order when requests wait for a free decode slot: lower goes first, ties in
    #: arrival order. The rollout node sets the time its group started, so an engine with more
    #: episodes in flight than decode rows finishes the oldest groups first instead of moving every
    #: episode through its turns in lock-step (which delays every group to the slowest sweep).
    priority: float = 0.0

    def __post_init__(self):
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class Generation:
    """One completion: generated ids, their log-probs, why it stopped, and the weights that made it."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]
    version: int
    meta: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Engine(Protocol):
    """What workflows and the node loop rely on."""

    #: Version of the weights currently loaded (0 = initial checkpoint).
    version: int
    #: Tokenizer of the served model (a transformers tokenizer); workflows render prompts with it.
    tokenizer: Any

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Generation]:
        """``params.n`` completions of ``prompt_ids``."""
        ...

    async def load_weights(self, update: WeightUpdate) -> None:
        """Install new weights; generations that start afterwards carry ``update.version``."""
        ...

    async def close(self) -> None: ...
