"""Batch -> tensors conversion (padding, masks, advantages, staleness) without a model."""

from __future__ import annotations

import pytest
import torch

from astraflow.protocol import Batch, Group, Sample
from astraflow.trainer.samples import collate_batch, group_advantages, sample_problem

PAD = 0


def _sample(tokens, mask, reward=0.0, *, advantage=0.0, weight=1.0, version=5, policy="p"):
    return Sample(
        policy=policy,
        role="r",
        task_id="t",
        episode_id="e",
        group_id="g",
        tokens=tokens,
        loss_mask=mask,
        logprobs=[-0.5 if m else 0.0 for m in mask],
        versions=[version if m else -1 for m in mask],
        reward=reward,
        advantage=advantage,
        weight=weight,
    )


def _batch(*groups):
    return Batch(
        id="b",
        policy="p",
        trainer_version=5,
        groups=[
            Group(id=f"g{i}", task_id="t", policy="p", samples=list(s))
            for i, s in enumerate(groups)
        ],
    )


def test_padding_and_multi_turn_masks():
    s1 = _sample([5, 6, 7, 8, 9, 10], [0, 0, 1, 0, 1, 1], reward=1.0)  # prompt 2, env token inside
    s2 = _sample([5, 6, 7, 11], [0, 0, 0, 1], reward=0.0)  # prompt 3
    c = collate_batch(_batch([s1, s2]), policy="p", pad_token_id=PAD, trainer_version=5)
    assert c.prompt_ids.tolist() == [[PAD, 5, 6], [5, 6, 7]]  # left-padded
    assert c.prompt_mask.tolist() == [[0, 1, 1], [1, 1, 1]]
    assert c.completion_ids.tolist() == [[7, 8, 9, 10], [11, PAD, PAD, PAD]]  # right-padded
    assert c.completion_mask.tolist() == [[1, 1, 1, 1], [1, 0, 0, 0]]  # attention: env included
    assert c.loss_mask.tolist() == [[1, 0, 1, 1], [1, 0, 0, 0]]  # loss: env excluded
    assert c.behaviour_logps.tolist() == [[-0.5, 0.0, -0.5, -0.5], [-0.5, 0.0, 0.0, 0.0]]
    std = torch.tensor([1.0, 0.0]).std().item()
    assert c.advantages.tolist() == pytest.approx([0.5 / (std + 1e-4), -0.5 / (std + 1e-4)])


def test_rows_padded_to_a_multiple_with_inert_rows():
    s = _sample([1, 2, 3], [0, 1, 1], reward=1.0)
    c = collate_batch(
        _batch([s, s.model_copy(), s.model_copy()]),
        policy="p",
        pad_token_id=PAD,
        trainer_version=5,
        pad_rows_to_multiple_of=2,
    )
    assert c.num_rows == 4 and c.trained_rows == 3
    assert c.loss_mask[3].sum() == 0 and c.completion_mask[3].sum() == 0
    assert c.group_index.tolist() == [0, 0, 0, -1]


def test_advantages_and_scaling():
    g = Group(
        id="g",
        task_id="t",
        policy="p",
        samples=[_sample([1, 2], [0, 1], reward=r) for r in (0.0, 1.0, 1.0, 0.0)],
    )
    centred = [-0.5, 0.5, 0.5, -0.5]
    std = torch.tensor([0.0, 1.0, 1.0, 0.0]).std().item()
    assert group_advantages(g, "group", batch_std=0.0) == pytest.approx(
        [a / (std + 1e-4) for a in centred]
    )
    assert group_advantages(g, "none", 0.0) == pytest.approx(centred)
    assert group_advantages(g, "batch", 2.0) == pytest.approx([a / 2.0001 for a in centred])
    # The dataflow's advantages win when it computed any.
    g.samples[0].advantage = 3.0
    assert group_advantages(g, "group", 0.0) == [3.0, 0.0, 0.0, 0.0]


def test_stale_zero_weight_and_empty_samples_are_counted_not_trained():
    fresh = _sample([1, 2, 3], [0, 1, 1], reward=1.0, version=5)
    stale = _sample([1, 2, 3], [0, 1, 1], reward=0.0, version=1)
    zero = _sample([1, 2, 3], [0, 1, 1], reward=0.0, weight=0.0)
    half = _sample([1, 2, 3], [0, 1, 1], reward=0.0, weight=0.5, advantage=-2.0)
    nothing = _sample([1, 2, 3], [0, 0, 0], reward=0.0)
    c = collate_batch(
        _batch([fresh, stale, zero, half, nothing]),
        policy="p",
        pad_token_id=PAD,
        trainer_version=5,
        max_staleness=2,
    )
    assert dict(c.skipped) == {"stale": 1, "zero_weight": 1, "no_generated_tokens": 1}
    assert c.loss_mask.sum(1).tolist() == [2, 0, 0, 2, 0]
    assert c.version_lag.tolist()[:2] == [0, 4]
    assert c.advantages[3].item() == pytest.approx(-1.0)  # dataflow advantage x weight 0.5


def test_bad_samples_are_quarantined_and_the_rest_trains():
    """A sample the trainer cannot train on never crashes the step: it is left out of the
    tensors and of its group's baseline, and reported (id -> why) for the ack."""
    good = _sample([1, 2, 3], [0, 1, 1], reward=1.0)
    other = _sample([1, 2, 3], [0, 1, 1], reward=0.0)
    foreign = _sample([1, 2], [0, 1], policy="q")
    out_of_vocab = _sample([1, 99], [0, 1], reward=5.0)
    c = collate_batch(
        _batch([good, foreign, out_of_vocab], [other]),
        policy="p",
        pad_token_id=0,
        trainer_version=5,
        vocab_size=50,
    )
    assert set(c.invalid) == {foreign.id, out_of_vocab.id}
    assert "belongs to policy 'q'" in c.invalid[foreign.id]
    assert "outside the model vocabulary [0, 50)" in c.invalid[out_of_vocab.id]
    assert c.skipped["invalid_sample"] == 2
    # what the wire types refuse, as if it had got past the door (a store written before)
    first_trained = Sample.model_construct(**{**good.__dict__, "loss_mask": [1, 1, 1]})
    assert "at least one prompt token" in sample_problem(first_trained, "p", 50)
    assert c.num_rows == 2 and c.trained_rows == 2
    assert int(c.prompt_ids.max()) < 50  # nothing of the quarantined samples reached the model
    # the out-of-vocab sample's reward 5.0 did not enter its group's baseline: a group of one
    assert c.advantages.tolist() == [0.0, 0.0]


def test_empty_share_yields_one_inert_row():
    c = collate_batch(_batch(), policy="p", pad_token_id=PAD, trainer_version=0)
    assert c.num_rows == 1 and c.trained_rows == 0 and c.loss_mask.sum() == 0


def test_turn_discount_gives_each_turn_its_normalised_return():
    """Two turns each (runs of loss mask 1); per-turn rewards become discounted returns,
    normalised over the group's turn returns, one advantage per turn's tokens."""
    s1 = _sample([1, 2, 3, 9, 4], [0, 1, 1, 0, 1], reward=1.0).model_copy(
        update={"turn_rewards": [1.0, 0.0]}
    )
    s2 = _sample([1, 5, 9, 6, 7], [0, 1, 0, 1, 1], reward=1.0).model_copy(
        update={"turn_rewards": [0.0, 1.0]}
    )
    plain = collate_batch(_batch([s1, s2]), policy="p", pad_token_id=PAD, trainer_version=5)
    assert plain.advantages.tolist() == [0.0, 0.0]  # equal totals: nothing to learn per sample
    c = collate_batch(
        _batch([s1, s2]), policy="p", pad_token_id=PAD, trainer_version=5, turn_discount=0.5
    )
    returns = [1.0, 0.0, 0.5, 1.0]  # s1: [1 + 0.5*0, 0]; s2: [0 + 0.5*1, 1]
    mean, std = sum(returns) / 4, torch.tensor(returns).std().item()
    a = [(g - mean) / (std + 1e-4) for g in returns]
    assert c.advantages.shape == (2, 4)
    expected = [[a[0], a[0], 0.0, a[1]], [a[2], 0.0, a[3], a[3]]]
    assert torch.allclose(c.advantages, torch.tensor(expected), atol=1e-6)


def test_turn_discount_without_kept_turn_rewards_credits_the_last_turn():
    """A sample with no per-turn rewards counts as [0, ..., reward]: earlier turns get the
    discounted final reward; a dataflow change of the total lands on the last turn."""
    from astraflow.protocol.advantages import sample_turn_rewards, turn_returns

    assert turn_returns(sample_turn_rewards(None, 1.0, 3), 0.5) == [0.25, 0.5, 1.0]
    assert sample_turn_rewards([0.2, 0.3], 1.0, 2) == pytest.approx([0.2, 0.8])
    s1 = _sample([1, 2, 9, 3], [0, 1, 0, 1], reward=1.0)
    s2 = _sample([1, 2, 9, 3], [0, 1, 0, 1], reward=0.0)
    c = collate_batch(
        _batch([s1, s2]), policy="p", pad_token_id=PAD, trainer_version=5,
        turn_discount=0.5, scale_rewards="none",
    )  # fmt: skip
    mean = (0.5 + 1.0) / 4
    expected = [[0.5 - mean, 0.0, 1.0 - mean], [-mean, 0.0, -mean]]
    assert torch.allclose(c.advantages, torch.tensor(expected), atol=1e-6)
