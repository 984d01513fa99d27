"""Advantages are computed by one set of functions (``astraflow/protocol/advantages.py``) for the
dataflow's batches and the trainer's in-process ones."""

from __future__ import annotations

import pytest

from astraflow.protocol import Group, Sample
from astraflow.protocol.advantages import advantages, reward_stats
from astraflow.trainer.samples import group_advantages

REWARDS = [0.0, 1.0, 1.0, 0.0]


def test_group_batch_and_unscaled_advantages():
    mean, std = reward_stats(REWARDS)
    assert (mean, std) == (0.5, pytest.approx(0.57735, abs=1e-5))
    assert advantages(REWARDS, "group") == [(r - 0.5) / (std + 1e-4) for r in REWARDS]
    assert advantages(REWARDS, "batch", batch_std=2.0) == [(r - 0.5) / 2.0001 for r in REWARDS]
    assert advantages(REWARDS, "none") == [-0.5, 0.5, 0.5, -0.5]
    assert reward_stats([]) == (0.0, 0.0) and reward_stats([3.0]) == (3.0, 0.0)


def test_a_stored_baseline_is_kept_when_samples_were_dropped():
    """The dataflow passes the group's statistics from ingestion: the samples a batching policy
    dropped still count in the baseline."""
    kept = REWARDS[1:]
    with_baseline = advantages(kept, "group", baseline=reward_stats(REWARDS))
    assert with_baseline == advantages(REWARDS, "group")[1:]
    assert with_baseline != advantages(kept, "group")


def test_the_trainer_fills_in_missing_advantages_with_the_same_function():
    samples = [
        Sample(
            id=f"s{i}",
            policy="p",
            role="r",
            task_id="t",
            episode_id=f"e{i}",
            group_id="g",
            tokens=[1, 2],
            loss_mask=[0, 1],
            logprobs=[0.0, -0.5],
            versions=[-1, 0],
            reward=r,
        )
        for i, r in enumerate(REWARDS)
    ]
    group = Group(id="g", task_id="t", policy="p", samples=samples)
    assert group_advantages(group, "group", 0.0) == advantages(REWARDS, "group")
