"""What a sample's ``advantage`` is, computed in one place: GRPO's group-normalised reward.

``advantage = (r - mean) / (std + 1e-4)`` (eps as in TRL), the std taken over the group
(``scale_rewards = "group"``), over the whole batch (``"batch"``) or not at all (``"none"``: just
``r - mean``). The dataflow service computes it when it forms a batch, from the group statistics
it stored at ingestion (so samples a batching policy drops keep their place in the baseline);
the trainer computes it only for a batch that arrives without any (one built in process), with
the same functions.

Turn-level credit (``trainer.turn_discount = gamma``, the trainer computes it): a sample's
generated turns (runs of loss mask 1) carry their own rewards ``r_1..r_T``; turn ``t``'s return is
``G_t = sum_{k>=t} gamma^(k-t) r_k``, and every turn of every sample of a group is normalised
against the group's turn returns, as AReaL does with ``apply_reward_discount`` and per-completion
samples. A sample without per-turn rewards counts as ``[0, ..., 0, reward]`` over its turns.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Literal

ScaleRewards = Literal["group", "batch", "none"]

#: Added to the reward std before dividing (same constant as TRL).
STD_EPS = 1e-4


def reward_std(rewards: Sequence[float]) -> float:
    """The unbiased standard deviation (0 for fewer than two rewards), as TRL's GRPO takes it."""
    return statistics.stdev(rewards) if len(rewards) > 1 else 0.0


def reward_stats(rewards: Sequence[float]) -> tuple[float, float]:
    """A group's reward mean and :func:`reward_std` (0, 0 for no rewards)."""
    if not rewards:
        return 0.0, 0.0
    return statistics.fmean(rewards), reward_std(rewards)


def advantages(
    rewards: Sequence[float],
    scale: ScaleRewards,
    *,
    baseline: tuple[float, float] | None = None,
    batch_std: float = 0.0,
) -> list[float]:
    """Advantages of one group's rewards. ``baseline``: the group's (mean, std) when it had more
    samples than ``rewards`` (default: those of ``rewards``); ``batch_std``: the std of the whole
    batch's rewards, for ``scale = "batch"``."""
    mean, std = baseline if baseline is not None else reward_stats(rewards)
    if scale == "group":
        return [(r - mean) / (std + STD_EPS) for r in rewards]
    if scale == "batch":
        return [(r - mean) / (batch_std + STD_EPS) for r in rewards]
    return [r - mean for r in rewards]


def turn_returns(turn_rewards: Sequence[float], gamma: float) -> list[float]:
    """``G_t = r_t + gamma * G_{t+1}``: the discounted return from each turn on."""
    out: list[float] = []
    running = 0.0
    for r in reversed(turn_rewards):
        running = float(r) + gamma * running
        out.append(running)
    return out[::-1]


def sample_turn_rewards(
    turn_rewards: Sequence[float] | None, reward: float, turns: int
) -> list[float]:
    """A sample's per-turn rewards, summing to its ``reward``: the kept ones (the last adjusted
    by what a dataflow policy changed of the total), or ``[0, ..., 0, reward]``."""
    if turns <= 0:
        return []
    if turn_rewards is None or len(turn_rewards) != turns:
        return [0.0] * (turns - 1) + [float(reward)]
    out = [float(r) for r in turn_rewards]
    out[-1] += float(reward) - sum(out)
    return out


def turn_advantages(
    group_returns: Sequence[Sequence[float]],
    scale: ScaleRewards,
    *,
    batch_std: float = 0.0,
) -> list[list[float]]:
    """Per-turn advantages of one group: each sample's turn returns normalised against all the
    group's turn returns (``batch_std``: the std of every turn return in the batch)."""
    flat = [g for returns in group_returns for g in returns]
    mean, std = reward_stats(flat)
    return [advantages(list(returns), scale, baseline=(mean, std), batch_std=batch_std)
            for returns in group_returns]  # fmt: skip
