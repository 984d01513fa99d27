"""Mixed precision done right: float32 master weights and AdamW state, bfloat16 compute by
autocast, bfloat16 weights published. At an RL learning rate a pure-bfloat16 model rounds most
updates away; float32 masters move the weights as a float32 run does."""

from __future__ import annotations

import torch
from test_micro_batches import ragged_groups
from trainer_rollouts import make_batch

from astraflow.recipe.schema import TrainerConfig
from astraflow.trainer.grpo import build_trainer, compute_dtype, resolve_precision
from astraflow.trainer.source import InProcessBatchSource

POLICY = "policy"
STEPS = 20
LR = 1e-6


def _train(tmp_path, model_path, dtype: str, *, pure_bf16: bool = False):
    """Train ``STEPS`` steps on the same synthetic batches; returns (fraction of parameter
    elements that moved, the published state of the last version, the trainer)."""
    cfg = TrainerConfig(
        groups_per_step=2, loss_type="dapo", learning_rate=LR, dtype=dtype, device="cpu",
        checkpoint_every=1000, publish_every=STEPS,
    )  # fmt: skip
    source = InProcessBatchSource(
        producer=lambda policy, n, v: make_batch(ragged_groups(v, version=v), POLICY, v)
    )
    published: dict[int, dict[str, torch.Tensor]] = {}

    def publish(version, state):
        published[version] = {k: v.clone() for k, v in state.items()}

    trainer = build_trainer(
        model_path, cfg, source, tmp_path / f"{dtype}-{pure_bf16}", POLICY, max_steps=STEPS,
        publish=publish,
    )  # fmt: skip
    if pure_bf16:  # what the trainer did before: bfloat16 parameters and AdamW state
        trainer.model.to(torch.bfloat16)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.run(resume=False)
    assert trainer.version == STEPS
    moved = total = 0
    for n, p in trainer.model.named_parameters():
        moved += int((p.detach() != before[n]).sum())
        total += p.numel()
    return moved / total, published[STEPS], trainer


def test_bf16_compute_moves_weights_like_fp32_and_publishes_bf16(tmp_path, tiny_model_path):
    fp32, fp32_state, _ = _train(tmp_path, tiny_model_path, "float32")
    mixed, mixed_state, trainer = _train(tmp_path, tiny_model_path, "bfloat16")
    pure, _, _ = _train(tmp_path, tiny_model_path, "bfloat16", pure_bf16=True)
    assert fp32 > 0.05, fp32
    # float32 masters + bf16 autocast: within 10 % of the float32 run's movement
    assert abs(mixed - fp32) <= 0.1 * fp32, (mixed, fp32)
    # pure bf16 parameters (the old behaviour) lose most updates to rounding
    assert pure < 0.5 * fp32, (pure, fp32)
    # the master weights and the optimizer state stay float32
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    for state in trainer.optimizer.state.values():
        assert all(v.dtype == torch.float32 for v in state.values() if v.dim() > 0)
    # nodes get bfloat16 (float32 when the trainer computes in float32)
    floats = [v for v in mixed_state.values() if v.is_floating_point()]
    assert floats and all(v.dtype == torch.bfloat16 for v in floats)
    assert all(v.dtype == torch.float32 for v in fp32_state.values() if v.is_floating_point())


def test_bf16_forward_runs_under_autocast(tmp_path, tiny_model_path):
    """The compute really is bfloat16: a linear layer's output during the loss forward."""
    cfg = TrainerConfig(groups_per_step=2, dtype="bfloat16", device="cpu")
    source = InProcessBatchSource()
    trainer = build_trainer(
        tiny_model_path, cfg, source, tmp_path, POLICY, max_steps=1, publish_on_start=False
    )
    seen = []
    layer = trainer.model.model.layers[0].mlp.down_proj
    hook = layer.register_forward_hook(lambda m, a, out: seen.append(out.dtype))
    source.put(make_batch(ragged_groups(), POLICY, 0))
    try:
        trainer.run(resume=False)
    finally:
        hook.remove()
    assert seen and set(seen) == {torch.bfloat16}
    assert layer.weight.dtype == torch.float32


def test_precision_resolution():
    assert resolve_precision(TrainerConfig(device="cpu", dtype="bfloat16")) == (
        "cpu",
        torch.float32,
    )
    assert compute_dtype(TrainerConfig(device="cpu", dtype="bfloat16")) == torch.bfloat16
    assert compute_dtype(TrainerConfig(device="cpu", dtype="auto")) == torch.float32
