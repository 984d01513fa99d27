"""AstraFlow's trainer is stock TRL's GRPO objective: the same multi-turn batch, the same numbers.

The batch is real: ``MathMultiTurn-v0`` episodes (several tries with feedback) played by
``single_agent`` on AstraFlow's transformers engine with the built-in tiny policy. It is fed to
``AstraGRPOTrainer`` (through a batch source, as the dataflow does) and to stock
``trl.GRPOTrainer`` (through a ``rollout_func`` returning the same tokens with ``env_mask`` = the
loss mask), configured as the agentic bench configures it (``bench/_trl.py``) from
``recipes/agentic_math.toml``. Same loss mask, ``num_items_in_batch``, loss and gradient; and
three on-policy lock-step steps of AstraFlow replayed into TRL end at the same weights.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

from astraflow.envs import default_registry  # noqa: E402
from astraflow.tasks.catalog import load_task_set  # noqa: E402

from astraflow.protocol import Batch, Group, Sample, Task, new_id  # noqa: E402
from astraflow.recipe import load_recipe  # noqa: E402
from astraflow.rollout.engines import SamplingParams, WeightUpdate, make_engine  # noqa: E402
from astraflow.rollout.env_runner import EnvRunner  # noqa: E402
from astraflow.rollout.workflows import RolePolicy, default_workflows  # noqa: E402
from astraflow.trainer.grpo import build_trainer  # noqa: E402
from astraflow.trainer.source import InProcessBatchSource  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
POLICY = "policy"
GROUPS, GROUP_SIZE, STEPS = 4, 8, 3


@pytest.fixture(scope="module")
def bench_trl():
    """The bench's TRL set-up module (``bench/_trl.py``)."""
    sys.path.insert(0, str(BENCH))
    try:
        import _trl

        yield _trl
    finally:
        sys.path.remove(str(BENCH))


def _recipe(loss_type: str):
    return load_recipe(
        REPO / "recipes" / "agentic_math.toml",
        [
            f"tasks.group_size={GROUP_SIZE}",
            f"policies.{POLICY}.trainer.groups_per_step={GROUPS}",
            f"policies.{POLICY}.trainer.loss_type={loss_type}",
        ],
    )


class Rollouts:
    """Multi-turn groups from AstraFlow's engine and ``single_agent``, at the engine's weights."""

    def __init__(self, model_path: str, recipe) -> None:
        self.engine = make_engine("transformers", model_path, device="cpu", seed=0)
        registry = default_registry()
        self.runner = EnvRunner(lambda env_id, kw: registry.make(env_id, **kw), workers=4)
        self.recipe = recipe
        self.tasks = load_task_set("arith", "train", seed=0, limit=400)
        self.drawn = 0

    def batch(self) -> Batch:
        """``GROUPS`` groups with a learning signal (rewards that differ), as the dataflow's
        zero-variance filter would pass them; tasks are drawn in loader order."""
        groups: list[Group] = []
        while len(groups) < GROUPS:
            assert self.drawn < len(self.tasks), "no learning signal in 400 tasks"
            groups += [g for g in self._play(GROUPS) if g.reward_std > 0]
        return Batch(id=new_id("batch"), policy=POLICY, trainer_version=self.engine.version,
                     groups=groups[:GROUPS])  # fmt: skip

    def _play(self, n: int) -> list[Group]:
        spec = self.recipe.policies[POLICY].sampling
        params = SamplingParams(temperature=spec.temperature, max_tokens=spec.max_tokens)
        agent = RolePolicy(POLICY, self.engine, params)
        workflow = default_workflows().get("single_agent")
        payloads = self.tasks[self.drawn : self.drawn + n]
        self.drawn += n
        tasks = [
            Task(env=self.recipe.tasks.env, payload=p, group_size=GROUP_SIZE) for p in payloads
        ]

        async def play():
            return await asyncio.gather(
                *(
                    workflow.fn(t, {"agent": agent}, self.runner.make, max_turns=3)
                    for t in tasks
                    for _ in range(GROUP_SIZE)
                )
            )

        episodes = asyncio.run(play())
        by_task: dict[str, list[Sample]] = defaultdict(list)
        for ep in episodes:
            (traj,) = ep.trajectories
            by_task[ep.task_id].append(
                Sample(
                    policy=POLICY,
                    role="agent",
                    task_id=ep.task_id,
                    episode_id=ep.id,
                    group_id=f"g-{ep.task_id}",
                    tokens=traj.tokens,
                    loss_mask=traj.loss_mask,
                    logprobs=traj.logprobs,
                    versions=traj.versions,
                    reward=ep.rewards["agent"],
                )  # fmt: skip
            )
        groups = []
        for t in tasks:
            samples = by_task[t.id]
            r = torch.tensor([s.reward for s in samples])
            groups.append(
                Group(
                    id=f"g-{t.id}",
                    task_id=t.id,
                    policy=POLICY,
                    samples=samples,
                    reward_mean=float(r.mean()),
                    reward_std=float(r.std()),
                )  # fmt: skip
            )
        return groups

    def load(self, version: int, state: dict[str, torch.Tensor]) -> None:
        full = {k: v.detach().clone() for k, v in state.items()}
        asyncio.run(self.engine.load_weights(WeightUpdate(version=version, full=full)))

    def close(self) -> None:
        asyncio.run(self.engine.close())
        self.runner.shutdown()


def _astraflow(recipe, model_path, source, run_dir, publish=None):
    return build_trainer(
        model_path, recipe.policies[POLICY].trainer, source, run_dir, POLICY,
        max_steps=STEPS, seed=recipe.run.seed, publish=publish, publish_on_start=publish is not None,
        temperature=recipe.policies[POLICY].sampling.temperature,
        max_completion_length=recipe.max_completion_length(POLICY),
    )  # fmt: skip


def _stock_trl(bench_trl, recipe, model_path, batches: list[Batch], out: Path):
    """Stock ``GRPOTrainer`` as the bench builds it, whose ``rollout_func`` replays ``batches``."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOTrainer

    from astraflow.models import load_tokenizer

    settings = bench_trl.grpo_settings(recipe)
    queue = list(batches)

    def rollout_func(prompts, trainer):
        batch = queue.pop(0)
        samples = batch.samples
        assert len(prompts) == len(samples)
        return {
            "prompt_ids": [s.tokens[: s.prompt_length] for s in samples],
            "completion_ids": [s.tokens[s.prompt_length :] for s in samples],
            "logprobs": None,
            "env_mask": [s.loss_mask[s.prompt_length :] for s in samples],
            "env_reward": [s.reward for s in samples],
        }

    def env_return(prompts, completions, env_reward, **_):
        return list(env_reward)

    tokenizer = load_tokenizer(model_path)
    tokenizer.padding_side = "left"
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"  # rollout_func is experimental in TRL 1.16
    rows = [{"prompt": [{"role": "user", "content": f"task {i}"}]} for i in range(GROUPS * STEPS)]
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32),
        reward_funcs=[env_return],
        args=bench_trl.grpo_config(settings, seed=recipe.run.seed, steps=STEPS, out=out),
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        rollout_func=rollout_func,
    )
    return trainer, rows, settings


def _scored_on_policy(batch: Batch, model_path: str, temperature: float, logprobs_of) -> Batch:
    """``batch`` with every sample's log-probs recomputed by the model being trained
    (``logprobs_of``: the ``trainer_logprobs`` fixture).

    Stock TRL without vLLM has no behaviour policy: it takes its own forward's log-probs as
    the old ones, so its importance ratio is 1. AstraFlow folds ``min(pi_prox / pi_behaviour,
    cap)`` in with the engine's log-probs, which differ from a training forward by float noise
    that depends on the rollouts. Scored by the trained weights themselves (one sample at a
    time, float64), AstraFlow's ratio is 1 to float rounding too, and the comparison is of the
    objectives alone."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float64).eval()
    groups = []
    for group in batch.groups:
        samples = []
        for s in group.samples:
            pl = s.prompt_length
            scored = logprobs_of(model, s.tokens[:pl], s.tokens[pl:], temperature).tolist()
            logprobs = list(s.logprobs[:pl]) + [
                new if m else old
                for new, old, m in zip(scored, s.logprobs[pl:], s.loss_mask[pl:], strict=True)
            ]
            samples.append(s.model_copy(update={"logprobs": logprobs}))
        groups.append(group.model_copy(update={"samples": samples}))
    return batch.model_copy(update={"groups": groups})


def _rows(ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
    """Each row's ids where ``mask`` is set (padding of either side removed)."""
    return [
        [int(t) for t, m in zip(r, mr, strict=True) if m] for r, mr in zip(ids, mask, strict=True)
    ]


def _loss_and_grad(trainer, inputs):
    # what Trainer.train sets before the first step (one accumulation window per batch)
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
    # float64: the gradient sums per-token terms of both signs (advantages of both signs), and
    # in float32 their rounding left 1e-5 to 1.2e-4 of relative difference between two runs of
    # the same objective that only batch their reductions differently
    trainer.model.double()
    trainer.model.train()
    trainer.model.zero_grad()
    out = trainer._generate_and_score_completions(inputs)
    # AstraFlow folds the (on-policy ~1) importance ratio into its advantages during the loss
    out["advantages_before_loss"] = out["advantages"].clone()
    loss = trainer.compute_loss(trainer.model, out)
    loss.backward()
    grad = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
    return out, loss.detach(), grad


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.mark.parametrize("loss_type", ["dapo", "dr_grpo"])
def test_one_multi_turn_batch_gives_trls_mask_loss_and_gradient(
    loss_type, bench_trl, tiny_model_path, tmp_path, trainer_logprobs
):
    """``dr_grpo`` divides by ``max_completion_length``: it agrees only when both sides use the
    same value (max_tokens x max_turns)."""
    recipe = _recipe(loss_type)
    rollouts = Rollouts(tiny_model_path, recipe)
    try:
        batch = rollouts.batch()
    finally:
        rollouts.close()
    temperature = recipe.policies[POLICY].sampling.temperature
    batch = _scored_on_policy(batch, tiny_model_path, temperature, trainer_logprobs)
    assert any(s.loss_mask.count(1) < len(s.tokens) - s.prompt_length for s in batch.samples), (
        "the batch should hold multi-turn samples (feedback tokens inside the completion)"
    )
    source = InProcessBatchSource()
    source.put(batch)
    ours = _astraflow(recipe, tiny_model_path, source, tmp_path / "astra")
    trl, rows, settings = _stock_trl(bench_trl, recipe, tiny_model_path, [batch], tmp_path)
    assert trl.max_completion_length == ours.max_completion_length == 36
    assert settings["max_completion_length"] == recipe.max_completion_length(POLICY)

    a_out, a_loss, a_grad = _loss_and_grad(ours, [{}] * len(batch.samples))
    # each prompt repeated group_size times, one dict each, as TRL's RepeatSampler feeds them
    inputs = [dict(rows[g]) for g in range(GROUPS) for _ in range(GROUP_SIZE)]
    t_out, t_loss, t_grad = _loss_and_grad(trl, inputs)

    a_mask = a_out["completion_mask"] * a_out["tool_mask"]
    t_mask = t_out["completion_mask"] * t_out["tool_mask"]
    assert _rows(a_out["completion_ids"], a_out["completion_mask"]) == _rows(
        t_out["completion_ids"], t_out["completion_mask"]
    )
    assert _rows(a_mask, a_out["completion_mask"]) == _rows(t_mask, t_out["completion_mask"])
    assert _rows(a_out["prompt_ids"], a_out["prompt_mask"]) == _rows(
        t_out["prompt_ids"], t_out["prompt_mask"]
    )
    assert int(a_out["num_items_in_batch"]) == int(t_out["num_items_in_batch"])
    torch.testing.assert_close(
        a_out["advantages_before_loss"], t_out["advantages_before_loss"], rtol=1e-5, atol=1e-5
    )
    assert float(a_loss) != 0.0
    assert abs(float(a_loss) - float(t_loss)) <= 1e-5 * abs(float(t_loss)), (a_loss, t_loss)
    assert _rel(a_grad, t_grad) <= 1e-4


def test_three_lock_step_steps_replayed_into_trl_end_at_the_same_weights(
    bench_trl, tiny_model_path, tmp_path
):
    """AstraFlow trains 3 steps, each on a batch played at the weights it just published
    (on-policy, lock-step); stock TRL replays those batches. Every step's loss agrees (relative
    1e-4: the losses of steps 2 and 3 are computed at the weights the earlier steps produced, so
    they check the whole trajectory), and the final weights agree within 1e-2 of their norm.

    The weights are also compared with the distance they moved, with a looser bound (a quarter
    of it): AdamW's first steps move every parameter by about ``lr x sign(grad)``, so a
    parameter whose gradient is near zero flips direction on float rounding alone, and this
    tiny model's landscape is sharp (gradient norms of 5-190 over three steps). Measured over
    runs with different rollouts: 1e-4 to 4e-3 of the distance here, 7.8e-2 once in CI, while
    the losses agreed to 1e-6."""
    recipe = _recipe("dapo")
    rollouts = Rollouts(tiny_model_path, recipe)
    try:
        source = InProcessBatchSource(producer=lambda policy, n, version: rollouts.batch())
        ours = _astraflow(recipe, tiny_model_path, source, tmp_path / "astra", rollouts.load)
        start = {k: v.detach().clone() for k, v in ours.model.state_dict().items()}
        assert ours.run(resume=False) == STEPS
    finally:
        rollouts.close()
    assert [b.trainer_version for b in source.served] == [0, 1, 2]
    trl, _, _ = _stock_trl(bench_trl, recipe, tiny_model_path, source.served, tmp_path)
    trl.train()
    assert trl.state.global_step == STEPS
    a_state, t_state = ours.model.state_dict(), trl.model.state_dict()
    a = torch.cat([a_state[k].flatten() for k in start])
    t = torch.cat([t_state[k].flatten() for k in start])
    w0 = torch.cat([start[k].flatten() for k in start])
    moved = float((a - w0).norm())
    assert moved > 0
    ours_losses = [h["loss"] for h in ours.state.log_history if "loss" in h]
    trl_losses = [h["loss"] for h in trl.state.log_history if "loss" in h]
    assert len(ours_losses) == len(trl_losses) == STEPS
    for step, (x, y) in enumerate(zip(ours_losses, trl_losses, strict=True), start=1):
        assert abs(x - y) <= 1e-4 * abs(y), (step, ours_losses, trl_losses)
    assert float((a - t).norm()) <= 1e-2 * float(a.norm()), (float((a - t).norm()), a.norm())
    assert float((a - t).norm()) <= 0.25 * moved, (float((a - t).norm()), moved)
