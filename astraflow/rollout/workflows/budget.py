"""How many tokens an episode's sequence may hold, so no workflow sends a prompt an engine refuses.

An engine generates only while prompt + completion fit its context (``engine.max_context``; an
engine without the attribute, e.g. an HTTP endpoint that does not say, is unbounded here), and a
trainer later runs the whole sequence through a model with that same context. So a workflow
bounds every role's sequence by ``min(max_total_tokens, max_context - 1)`` (one position kept for
the token a turn must generate), asks for at most the room left, and ends the episode with
``finish_reason = "length"`` when no room is left, skipping a feedback message that would not
fit. The episode is kept and scored as its env scored the turns played, like a truncated one.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from astraflow.rollout.engines.base import SamplingParams

#: The episode ran out of context (or of the recipe's ``max_total_tokens``).
LENGTH = "length"


def context_limit(engine: Any, max_total_tokens: int | None = None) -> int:
    """Most tokens one role's sequence may hold: the recipe's bound and the engine's context - 1."""
    limit = int(max_total_tokens) if max_total_tokens else 1 << 30
    context = getattr(engine, "max_context", None)
    if isinstance(context, int) and context > 1:
        limit = min(limit, context - 1)
    return limit


def room(limit: int, tokens: list[int]) -> int:
    """Tokens that may still be generated after ``tokens`` (<= 0: none)."""
    return limit - len(tokens)


def fits(limit: int, tokens: list[int], more: list[int]) -> bool:
    """Whether ``more`` (an observation, a feedback message) can follow ``tokens`` and still leave
    room for at least one generated token."""
    return len(tokens) + len(more) < limit


def capped(params: SamplingParams, limit: int, tokens: list[int]) -> SamplingParams:
    """``params`` with ``max_tokens`` cut to the room left (call only when ``room(...) > 0``)."""
    return replace(params, max_tokens=max(1, min(params.max_tokens, room(limit, tokens))))
