"""Memory-bounded steps: a batch split into micro-batches by ``trainer.micro_batch_tokens``
accumulates exactly the one-batch gradient (float64, every normalisation TRL has), and no
forward of the policy holds more than the budget's padded tokens."""

from __future__ import annotations

import random

import pytest
import torch
from trainer_rollouts import make_batch

from astraflow.protocol import Group, Sample, new_id
from astraflow.recipe.schema import TrainerConfig
from astraflow.trainer.grpo import build_trainer, make_grpo_config
from astraflow.trainer.samples import micro_batch_rows
from astraflow.trainer.source import InProcessBatchSource

POLICY = "policy"
VOCAB = 361  # the tiny policy's


def _sample(
    rng: random.Random, group_id: str, task_id: str, prompt: int, turns: list, version: int
) -> Sample:
    """A sample with ``prompt`` prompt tokens, then generated turns separated by tool output:
    ``turns`` alternates generated and tool token counts (the tool tokens carry no loss)."""
    tokens = [rng.randrange(4, VOCAB) for _ in range(prompt)]
    mask, logps, versions = [0] * prompt, [0.0] * prompt, [-1] * prompt
    for k, n in enumerate(turns):
        generated = k % 2 == 0
        tokens += [rng.randrange(4, VOCAB) for _ in range(n)]
        mask += [1 if generated else 0] * n
        # behaviour log-probs far from the policy's: the importance ratio is truncated
        logps += [-rng.uniform(3.0, 9.0) if generated else 0.0 for _ in range(n)]
        versions += [version if generated else -1] * n
    return Sample(
        policy=POLICY, role="agent", task_id=task_id, episode_id=new_id("ep"),
        group_id=group_id, tokens=tokens, loss_mask=mask, logprobs=logps, versions=versions,
        reward=rng.random(),
    )  # fmt: skip


def ragged_groups(seed: int = 0, version: int = 0) -> list[Group]:
    """Two groups of four rows of very different lengths, with tool output inside completions,
    generated at ``version``."""
    rng = random.Random(seed)
    groups = []
    for _ in range(2):
        gid, tid = new_id("grp"), new_id("task")
        samples = [
            _sample(
                rng,
                gid,
                tid,
                rng.randint(3, 12),
                [rng.randint(2, 6), rng.randint(1, 5), n],
                version,
            )
            for n in (1, 4, 9, 17)
        ]
        rewards = torch.tensor([s.reward for s in samples])
        groups.append(
            Group(
                id=gid,
                task_id=tid,
                policy=POLICY,
                samples=samples,
                reward_mean=float(rewards.mean()),
                reward_std=float(rewards.std()),
            )  # fmt: skip
        )
    return groups


def _copy(inputs: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def _gradient(trainer, inputs: dict, budget: int | None) -> tuple[torch.Tensor, float]:
    trainer.micro_batch_tokens = budget
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(trainer.model, _copy(inputs))
    loss.backward()
    grads = [p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None]
    return torch.cat(grads), float(loss.detach())


@pytest.fixture()
def float64_trainer(tmp_path, tiny_model_path):
    def make(loss_type: str):
        cfg = TrainerConfig(groups_per_step=2, loss_type=loss_type, dtype="float32")
        source = InProcessBatchSource()
        trainer = build_trainer(
            tiny_model_path, cfg, source, tmp_path / loss_type, POLICY, max_steps=1,
            publish_on_start=False,
        )  # fmt: skip
        trainer.model.to(torch.float64).train()
        source.put(make_batch(ragged_groups(), POLICY, trainer.version))
        inputs = trainer._generate_and_score_completions([])
        return trainer, inputs

    return make


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "bnpo"])
def test_accumulated_gradient_equals_the_one_batch_gradient(float64_trainer, loss_type):
    trainer, inputs = float64_trainer(loss_type)
    mask = inputs["completion_mask"] * inputs["tool_mask"]
    assert bool((mask != inputs["completion_mask"]).any())  # tool tokens are in the batch
    budget = 60
    trainer.micro_batch_tokens = budget
    parts = trainer._split_micro_batches(inputs)
    sizes = sorted(p["completion_ids"].size(0) for p in parts)
    assert len(parts) >= 3 and sizes[0] != sizes[-1], sizes  # unequal micro-batches
    for p in parts:  # each within the budget, or a single over-long row
        tokens = p["prompt_ids"].size(1) + p["completion_ids"].size(1)
        assert p["prompt_ids"].size(0) * tokens <= budget or p["prompt_ids"].size(0) == 1

    whole, whole_loss = _gradient(trainer, inputs, None)
    accumulated, accumulated_loss = _gradient(trainer, inputs, budget)
    assert float(whole.norm()) > 0
    rel = float((accumulated - whole).norm() / whole.norm())
    assert rel < 1e-6, rel
    assert accumulated_loss == pytest.approx(whole_loss, rel=1e-9, abs=1e-12)


def test_per_slice_normalisation_would_not_be_exact(float64_trainer):
    """Why the shares matter: the same micro-batches, each normalised on its own and summed
    with equal weights (TRL's gradient accumulation), give another gradient."""
    trainer, inputs = float64_trainer("dapo")
    whole, _ = _gradient(trainer, inputs, None)
    trainer.micro_batch_tokens = 60
    parts = trainer._split_micro_batches(inputs)
    trainer.model.zero_grad(set_to_none=True)
    for part in parts:
        part = dict(part)
        part["num_items_in_batch"] = (part["completion_mask"] * part["tool_mask"]).sum()
        (trainer._compute_loss(trainer.model, _copy(part)) / len(parts)).backward()
    naive = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
    assert float((naive - whole).norm() / whole.norm()) > 1e-3


def test_no_policy_forward_holds_more_than_the_budget(tmp_path, tiny_model_path):
    """Every forward of the backbone during a real optimizer step sees at most the budget's
    padded tokens (one over-long row alone excepted); the log-probabilities come from TRL's
    fused head, which projects onto the vocabulary in tiles, so no rows x length x vocabulary
    tensor of the batch exists either."""
    budget = 48
    cfg = TrainerConfig(groups_per_step=2, loss_type="dapo", micro_batch_tokens=budget)
    source = InProcessBatchSource()
    trainer = build_trainer(
        tiny_model_path, cfg, source, tmp_path, POLICY, max_steps=1, publish_on_start=False
    )
    source.put(make_batch(ragged_groups(1), POLICY, trainer.version))
    seen: list[tuple[int, int]] = []
    backbone = trainer.model.get_base_model() if hasattr(trainer.model, "get_base_model") else None
    backbone = (backbone or trainer.model).model
    hook = backbone.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(tuple(kwargs["input_ids"].shape)),
        with_kwargs=True,
    )
    vocab_outputs: list[tuple[int, ...]] = []
    head = trainer.model.get_output_embeddings()
    head_hook = head.register_forward_hook(lambda m, a, out: vocab_outputs.append(out.shape))
    try:
        trainer.run(resume=False)
    finally:
        hook.remove()
        head_hook.remove()
    assert trainer.version == 1
    assert len(seen) >= 3, seen
    for rows, length in seen:
        assert rows * length <= budget or rows == 1, seen
    batch_rows = sum(r for r, _ in seen)
    assert batch_rows == 8  # every row went through exactly one forward
    assert not vocab_outputs  # the lm_head module never produced full logits


def test_micro_batch_rows_packs_longest_first_within_the_budget():
    groups = micro_batch_rows([2, 2, 2, 2, 30], [3, 10, 4, 1, 5], budget=24)
    assert groups[0] == [4]  # 35 tokens: over the budget, alone
    for g in groups[1:]:
        width = max(2 for _ in g) + max([3, 10, 4, 1, 5][i] for i in g)
        assert len(g) * width <= 24
    assert sorted(i for g in groups for i in g) == [0, 1, 2, 3, 4]
    assert micro_batch_rows([5] * 4, [5] * 4, budget=10_000) == [[0, 1, 2, 3]]
    with pytest.raises(ValueError):
        micro_batch_rows([1], [1], budget=0)


def test_gradient_accumulation_in_extra_is_refused(tmp_path):
    for key in ("gradient_accumulation_steps", "steps_per_generation"):
        cfg = TrainerConfig(extra={key: 4})
        with pytest.raises(ValueError, match="micro_batch_tokens"):
            make_grpo_config(
                cfg, output_dir=tmp_path, max_steps=1, seed=0, device="cpu", bf16=False,
                fp16=False, temperature=1.0, max_completion_length=16,
            )  # fmt: skip


def test_micro_batch_tokens_must_be_positive():
    with pytest.raises(ValueError):
        TrainerConfig(micro_batch_tokens=0)
    assert TrainerConfig().micro_batch_tokens > 0


@pytest.mark.slow
def test_two_processes_with_micro_batches_reach_the_one_pass_weights(tmp_path):
    """Under DDP each rank splits its share into its own number of micro-batches (gradients
    synchronised once, on each rank's last): 2 SGD steps end where one process's one-pass
    steps end."""
    import sys
    from pathlib import Path

    from process_runs import TORCHRUN_2, run_to_completion
    from safetensors.torch import load_file

    worker = str(Path(__file__).resolve().parent / "micro_batch_worker.py")
    run_to_completion([sys.executable, worker, str(tmp_path), "one", "100000"], timeout=300)
    run_to_completion([*TORCHRUN_2, worker, str(tmp_path), "two", "48"], timeout=300)
    one = load_file(tmp_path / "one-rank0.safetensors")
    two = load_file(tmp_path / "two-rank0.safetensors")
    two_r1 = load_file(tmp_path / "two-rank1.safetensors")
    from astraflow.models import resolve_model

    init = load_file(Path(resolve_model("builtin:tiny-arith")) / "model.safetensors")
    moved = max(float((one[k] - init[k]).abs().max()) for k in one)
    diff = max(float((one[k] - two[k]).abs().max()) for k in one)
    assert moved > 100 * 1e-6, moved  # the steps moved the weights: the comparison means something
    assert diff <= 1e-6, (diff, moved)
    assert all(torch.equal(two[k], two_r1[k]) for k in two)
