"""Loss variants per policy: M2PO's second-moment mask for stale samples (selection logic on
crafted log-ratios, then in a real loss of the tiny policy) and GSPO-style sequence-level ratios
passed through to TRL."""

from __future__ import annotations

import pytest
import torch
from trainer_rollouts import make_batch, rollout_group

from astraflow.protocol import Group, new_id
from astraflow.recipe.schema import TrainerConfig
from astraflow.trainer.grpo import build_trainer, make_grpo_config
from astraflow.trainer.m2po import m2po_keep, m2po_ratio
from astraflow.trainer.source import InProcessBatchSource

POLICY = "policy"


def test_m2po_keeps_fresh_tokens_and_masks_only_the_extreme_ones():
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.float32)
    fresh = torch.full((2, 5), 0.1)  # (log r)^2 = 0.01 <= 0.04 everywhere
    assert torch.equal(m2po_keep(fresh, mask, 0.04), mask)
    log_r = torch.tensor([[0.1, -3.0, 0.1, 0.1, 9.0], [0.1, 0.1, 0.5, -0.1, 0.1]])
    keep = m2po_keep(log_r, mask, 0.04)
    # the -3.0 token goes first (9.0 is padding: not a loss token); then 0.5 (0.25 > bound)
    expected = mask.clone()
    expected[0, 1] = 0
    expected[1, 2] = 0
    assert torch.equal(keep, expected)
    kept = (log_r**2)[keep.bool()]
    assert kept.mean() <= 0.04
    # a looser bound masks less: only the -3.0 token
    assert int(mask.sum() - m2po_keep(log_r, mask, 0.1).sum()) == 1
    ratio, masked = m2po_ratio(log_r, torch.zeros_like(log_r), mask, 0.04)
    assert masked == pytest.approx(2 / 9)
    assert ratio[0, 1] == 0 and ratio[0, 0] == pytest.approx(torch.exp(torch.tensor(0.1)))


def test_m2po_masks_as_few_tokens_as_the_bound_allows():
    gen = torch.Generator().manual_seed(0)
    log_r = torch.randn(8, 64, generator=gen) * 0.3
    mask = torch.ones(8, 64)
    keep = m2po_keep(log_r, mask, 0.04)
    sq = (log_r**2)[keep.bool()]
    assert sq.mean() <= 0.04
    # minimal: putting back the smallest masked token breaks the bound
    dropped = (log_r**2)[~keep.bool()]
    worst = torch.cat([sq, dropped.min().unsqueeze(0)])
    assert worst.mean() > 0.04
    # and it masks the largest ones: every kept token is below every masked one
    assert sq.max() <= dropped.min()


@pytest.fixture()
def make_trainer(tmp_path, tiny_model_path):
    def make(**cfg):
        trainer_cfg = TrainerConfig(groups_per_step=1, **cfg)
        source = InProcessBatchSource()
        trainer = build_trainer(
            tiny_model_path, trainer_cfg, source, tmp_path, POLICY, max_steps=1,
            publish_on_start=False,
        )  # fmt: skip
        trainer.model.train()
        return trainer, source

    return make


def _loss(trainer, source, group: Group):
    source.put(make_batch([group], POLICY, trainer.version))
    inputs = trainer._generate_and_score_completions([])
    trainer._metrics["train"].clear()
    trainer.model.zero_grad()
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    return loss.detach(), inputs


def _stale_group(tiny_policy) -> Group:
    model, tok = tiny_policy
    group = rollout_group(model, tok, "21+13", "34", policy=POLICY, group_size=2, version=0)
    group.samples[0].advantage, group.samples[1].advantage = 1.0, -1.0
    first = group.samples[0].loss_mask.index(1)
    group.samples[0].logprobs[first] -= 2.0  # one token the stale policy found far less likely
    return Group(id=new_id("g"), task_id="t", policy=POLICY, samples=group.samples)


def test_m2po_masks_the_stale_outlier_token_in_a_real_loss(make_trainer, tiny_policy):
    trainer, source = make_trainer(off_policy="m2po", m2po_threshold=0.04)
    assert trainer.m2po_threshold == 0.04
    _, inputs = _loss(trainer, source, _stale_group(tiny_policy))
    ratio = inputs["importance_sampling_ratio"]
    mask = (inputs["completion_mask"] * inputs["tool_mask"]).bool()
    assert (ratio[mask] == 0).sum() == 1  # only the outlier is masked ...
    assert ratio[0][mask[0]][0] == 0  # ... and it is the shifted one
    assert trainer._metrics["train"]["sampling/m2po_masked_fraction"][-1] == pytest.approx(
        1 / int(mask.sum())
    )
    # the default correction keeps that token, with its ratio e^2 truncated at the cap (2)
    default, source2 = make_trainer()
    assert default.m2po_threshold is None
    _, inputs2 = _loss(default, source2, _stale_group(tiny_policy))
    assert inputs2["importance_sampling_ratio"].max().item() == pytest.approx(2.0)


@pytest.mark.parametrize(("loss_type", "level"), [("grpo", "sequence"), ("luspo", "token")])
def test_gspo_sequence_ratios_and_other_trl_losses_reach_trl(
    make_trainer, tiny_policy, loss_type, level, tmp_path
):
    cfg = TrainerConfig(loss_type=loss_type, importance_sampling_level=level)
    args = make_grpo_config(
        cfg, output_dir=tmp_path, max_steps=1, seed=0, device="cpu", bf16=False, fp16=False,
        temperature=1.0, max_completion_length=16,
    )  # fmt: skip
    assert (args.loss_type, args.importance_sampling_level) == (loss_type, level)
    trainer, source = make_trainer(loss_type=loss_type, importance_sampling_level=level)
    assert trainer.importance_sampling_level == level
    model, tok = tiny_policy
    group = rollout_group(model, tok, "7+8", "15", policy=POLICY, group_size=2, version=0)
    group.samples[0].advantage, group.samples[1].advantage = 1.0, -0.5
    loss, _ = _loss(trainer, source, group)
    grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
    assert torch.isfinite(loss) and sum(float(g.abs().sum()) for g in grads) > 0
