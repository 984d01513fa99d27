"""Real optimizer steps of the AstraFlow trainer on the built-in tiny policy.

Samples are real rollouts (sampled by the tiny model with transformers, behaviour log-probs from the
logits it sampled from); the trainer is the real TRL GRPOTrainer subclass.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from trainer_rollouts import arith_producer, arith_prompts, make_batch, rollout_group

from astraflow.protocol import Group, Sample, new_id
from astraflow.recipe.schema import TrainerConfig
from astraflow.trainer.grpo import AstraGRPOTrainer, build_trainer
from astraflow.trainer.source import InProcessBatchSource

POLICY = "solver"


class EventSource(InProcessBatchSource):
    """In-process source that also records acks in a shared event log."""

    def __init__(self, events: list, **kw):
        super().__init__(**kw)
        self.events = events

    def ack(self, batch_id, trainer_version, metrics, **kw):
        self.events.append(("ack", trainer_version))
        super().ack(batch_id, trainer_version, metrics, **kw)


def _fresh_generator(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def test_real_steps_publish_then_ack_and_resume(tmp_path, tiny_model_path, tiny_policy):
    """3 real steps: finite loss, params move, publish(v) precedes ack(v); resume continues at v=3."""
    _, tok = tiny_policy
    generator = _fresh_generator(tiny_model_path)
    initial = {k: v.clone() for k, v in generator.state_dict().items()}
    events: list = []
    torch.manual_seed(0)

    producer = arith_producer(generator, tok)

    def publish(version, state_dict):
        events.append(("publish", version))
        # The in-process "rollout node" follows the trainer, so every batch is on-policy.
        generator.load_state_dict(state_dict)

    source = EventSource(events, producer=producer)
    cfg = TrainerConfig(groups_per_step=2, learning_rate=1e-3, checkpoint_every=3)
    trainer = build_trainer(
        tiny_model_path, cfg, source, tmp_path, POLICY, max_steps=3, publish=publish
    )
    assert isinstance(trainer, AstraGRPOTrainer)
    assert torch.get_num_threads() == 1
    assert trainer.run(resume=False) == 3

    assert events == [
        ("publish", 0),
        ("publish", 1),
        ("ack", 1),
        ("publish", 2),
        ("ack", 2),
        ("publish", 3),
        ("ack", 3),
    ]
    assert [a.batch_id for a in source.acks] == [b.id for b in source.served]
    for ack in source.acks:
        m = ack.metrics
        assert math.isfinite(m["loss"]) and m["grad_norm"] > 0
        assert m["tokens"] > 0 and m["samples"] == 8
        # Same tokens, same weights: the trainer's log-probs match the behaviour log-probs.
        assert m["sampling/sampling_logp_difference/mean"] < 1e-4
    moved = [k for k, v in trainer.model.state_dict().items() if not torch.equal(v, initial[k])]
    assert len(moved) > len(initial) // 2

    ckpt = Path(tmp_path) / "checkpoints" / POLICY / "checkpoint-3"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "trainer_state.json"):
        assert (ckpt / name).is_file(), name
    assert (ckpt / "optimizer.pt").is_file()

    # Resume: a new process continues at version 3 and produces version 4.
    events.clear()
    source2 = EventSource(events, producer=producer)
    trainer2 = build_trainer(
        tiny_model_path, cfg, source2, tmp_path, POLICY, max_steps=4, publish=publish
    )
    assert trainer2.run(resume=True) == 4
    # the checkpoint's own batch is acknowledged again first (idempotent at the dataflow)
    assert events == [("ack", 3), ("publish", 3), ("publish", 4), ("ack", 4)]
    assert source2.served[0].trainer_version == 3


def test_source_exhausted_stops_and_checkpoints(tmp_path, tiny_model_path, tiny_policy):
    model, tok = tiny_policy
    source = InProcessBatchSource()
    source.put(
        make_batch(
            [rollout_group(model, tok, "2+2", "4", policy=POLICY, group_size=4, version=0)],
            POLICY,
            0,
        )
    )
    source.close()
    trainer = build_trainer(
        tiny_model_path, TrainerConfig(groups_per_step=1), source, tmp_path, POLICY, max_steps=50
    )
    assert trainer.run(resume=False) == 1
    assert [a.trainer_version for a in source.acks] == [1]
    assert (
        Path(tmp_path) / "checkpoints" / POLICY / "checkpoint-1" / "model.safetensors"
    ).is_file()


# --------------------------------------------------------------------------- loss-level checks


@pytest.fixture()
def loss_trainer(tmp_path, tiny_model_path):
    """A trainer whose loss we evaluate directly on hand-fed batches (no optimizer step)."""

    def make(**kw) -> tuple[AstraGRPOTrainer, InProcessBatchSource]:
        extra = kw.pop("extra", {})
        cfg = TrainerConfig(groups_per_step=1, loss_type="dapo", extra=extra)
        source = InProcessBatchSource()
        trainer = build_trainer(
            tiny_model_path,
            cfg,
            source,
            tmp_path,
            POLICY,
            max_steps=1,
            publish_on_start=False,
            **kw,
        )
        trainer.model.train()
        return trainer, source

    return make


def _loss(trainer: AstraGRPOTrainer, source: InProcessBatchSource, groups: list[Group]):
    source.put(make_batch(groups, POLICY, trainer.version))
    inputs = trainer._generate_and_score_completions([])
    trainer._metrics["train"].clear()
    trainer.model.zero_grad()
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
    return loss.detach(), grads, inputs


@torch.no_grad()
def _token_logps(model, tokens: list[int]) -> torch.Tensor:
    """log p(token_t | tokens_<t) for t >= 1 (index t-1 in the result), temperature 1."""
    ids = torch.tensor([tokens])
    logits = model(ids).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1)


def _multi_turn_sample(model, tok, advantage: float, seed: int) -> Sample:
    """prompt | turn 1 (generated) | env observation (masked) | turn 2 (generated)."""
    torch.manual_seed(seed)
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompt = enc("<|user|>12+30<|end|><|assistant|>")
    turn1 = model.generate(
        torch.tensor([prompt]),
        do_sample=True,
        max_new_tokens=4,
        top_k=0,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )[0, len(prompt) :].tolist()
    obs = enc("<|end|><|tool|>wrong, try again<|end|><|assistant|>")
    ctx = prompt + turn1 + obs
    turn2 = model.generate(
        torch.tensor([ctx]),
        do_sample=True,
        max_new_tokens=4,
        top_k=0,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )[0, len(ctx) :].tolist()
    tokens = ctx + turn2
    mask = [0] * len(prompt) + [1] * len(turn1) + [0] * len(obs) + [1] * len(turn2)
    lp = [0.0] + _token_logps(model, tokens).tolist()
    logprobs = [x if m else 0.0 for x, m in zip(lp, mask, strict=True)]
    return Sample(
        policy=POLICY,
        role="agent",
        task_id="t",
        episode_id=new_id("ep"),
        group_id="g",
        tokens=tokens,
        loss_mask=mask,
        logprobs=logprobs,
        versions=[0 if m else -1 for m in mask],
        reward=advantage,
        advantage=advantage,
    )


def _group(samples: list[Sample]) -> Group:
    return Group(id="g", task_id="t", policy=POLICY, samples=samples)


def test_multi_turn_loss_mask(loss_trainer, tiny_policy):
    """Env tokens are attended but never trained on; the loss matches an independent formula."""
    model, tok = tiny_policy
    trainer, source = loss_trainer()
    s1, s2 = (
        _multi_turn_sample(model, tok, 1.0, seed=1),
        _multi_turn_sample(model, tok, -1.0, seed=2),
    )
    base, grads, inputs = _loss(trainer, source, [_group([s1, s2])])
    # The env observation is inside the completion, visible to attention, excluded from the loss.
    row_mask = inputs["tool_mask"][0][inputs["completion_mask"][0].bool()].tolist()
    assert row_mask == s1.loss_mask[s1.prompt_length :]
    assert 0 in row_mask and inputs["completion_mask"][0].sum() == len(row_mask)

    # Independent DAPO value: -sum_i sum_{t generated} A_i * min(exp(lp - behaviour), cap) / N.
    num = 0.0
    n_tokens = 0
    for s in (s1, s2):
        lp = [0.0] + _token_logps(trainer.model, s.tokens).tolist()
        for t, m in enumerate(s.loss_mask):
            if m:
                num += s.advantage * min(math.exp(lp[t] - s.logprobs[t]), 2.0)
                n_tokens += 1
    assert base.item() == pytest.approx(-num / n_tokens, abs=1e-5)

    # Garbage behaviour log-probs on masked (env) tokens change nothing.
    env = [i for i, m in enumerate(s1.loss_mask) if not m and i >= s1.prompt_length]
    garbage = s1.model_copy(deep=True)
    for i in env:
        garbage.logprobs[i] = -50.0
    same, same_grads, _ = _loss(trainer, source, [_group([garbage, s2])])
    assert same.item() == pytest.approx(base.item(), abs=1e-7)
    assert torch.allclose(same_grads, grads)

    # The env tokens are context: changing them changes the later generated tokens' log-probs.
    other = s1.model_copy(deep=True)
    for i in env[3:-2]:
        other.tokens[i] = tok.convert_tokens_to_ids("x")
    changed, _, _ = _loss(trainer, source, [_group([other, s2])])
    assert changed.item() != pytest.approx(base.item(), abs=1e-6)


def test_turn_discount_credits_each_turn_in_the_loss(loss_trainer, tiny_policy):
    """trainer.turn_discount: TRL's loss takes per-token advantages, each turn's the normalised
    discounted return from that turn on (equal totals: no signal without it)."""
    model, tok = tiny_policy
    trainer, source = loss_trainer()
    s1 = _multi_turn_sample(model, tok, 0.0, seed=1).model_copy(
        update={"reward": 1.0, "turn_rewards": [1.0, 0.0]}
    )
    s2 = _multi_turn_sample(model, tok, 0.0, seed=2).model_copy(
        update={"reward": 1.0, "turn_rewards": [0.0, 1.0]}
    )
    flat, _, _ = _loss(trainer, source, [_group([s1, s2])])
    assert flat.item() == 0.0  # one advantage per sample: equal rewards, nothing to learn
    trainer.turn_discount = 0.5
    loss, _, inputs = _loss(trainer, source, [_group([s1, s2])])
    assert inputs["advantages"].dim() == 2
    returns = {id(s1): [1.0, 0.0], id(s2): [0.5, 1.0]}
    flat_returns = [g for r in returns.values() for g in r]
    mean = sum(flat_returns) / 4
    std = torch.tensor(flat_returns).std().item()
    num, n_tokens = 0.0, 0
    for s in (s1, s2):
        lp = [0.0] + _token_logps(trainer.model, s.tokens).tolist()
        turn = -1
        for t, m in enumerate(s.loss_mask):
            if m and not s.loss_mask[t - 1]:
                turn += 1
            if m:
                adv = (returns[id(s)][turn] - mean) / (std + 1e-4)
                num += adv * min(math.exp(lp[t] - s.logprobs[t]), 2.0)
                n_tokens += 1
    assert loss.item() == pytest.approx(-num / n_tokens, abs=1e-5)


def test_behaviour_logprobs_drive_importance_ratio(loss_trainer, tiny_policy):
    model, tok = tiny_policy
    group = rollout_group(model, tok, "21+13", "34", policy=POLICY, group_size=2, version=0)
    s_pos, s_neg = group.samples
    s_pos.advantage, s_neg.advantage = 1.0, -1.0
    shifted = s_pos.model_copy(deep=True)
    for i, m in enumerate(shifted.loss_mask):
        if m:
            shifted.logprobs[i] -= 1.0  # behaviour policy thought these tokens e times less likely

    # Default (decoupled, truncated IS): pi_prox/pi_behaviour = e -> capped at 2, loss doubles.
    trainer, source = loss_trainer()
    exact, _, _ = _loss(trainer, source, [_group([s_pos, s_neg])])
    corrected, _, inputs = _loss(trainer, source, [_group([shifted, s_neg])])
    n_pos = sum(s_pos.loss_mask)
    n = n_pos + sum(s_neg.loss_mask)
    # exact: -(n_pos*1 - n_neg*1)/n ; corrected: -(n_pos*2 - n_neg*1)/n
    assert corrected.item() - exact.item() == pytest.approx(-n_pos / n, abs=1e-4)
    ratio = inputs["importance_sampling_ratio"]
    assert ratio.max().item() == pytest.approx(2.0)

    # Correction off: behaviour log-probs are TRL's old_per_token_logps, so PPO clips the ratio e.
    trainer2, source2 = loss_trainer(extra={"vllm_importance_sampling_correction": False})
    _, _, inputs2 = _loss(trainer2, source2, [_group([shifted, s_neg])])
    assert torch.equal(inputs2["old_per_token_logps"], inputs2["sampling_per_token_logps"])
    assert "importance_sampling_ratio" not in inputs2
    clip_high = trainer2._metrics["train"]["clip_ratio/high_mean"][-1]
    assert clip_high > 0.3  # the positive sample's tokens are all clipped at 1 + epsilon


def test_importance_correction_costs_no_extra_forward(loss_trainer, tiny_policy):
    """The proximal log-probs come from the loss forward itself: one forward per step, not two."""
    model, tok = tiny_policy
    group = rollout_group(model, tok, "21+13", "34", policy=POLICY, group_size=2, version=0)
    group.samples[0].advantage, group.samples[1].advantage = 1.0, -1.0
    for i, m in enumerate(group.samples[0].loss_mask):
        if m:
            group.samples[0].logprobs[i] -= 1.0  # off-policy: the ratio is not 1
    trainer, source = loss_trainer()
    calls = []
    handle = trainer.model.register_forward_hook(lambda *_: calls.append(torch.is_grad_enabled()))
    try:
        _, _, inputs = _loss(trainer, source, [group])
    finally:
        handle.remove()
    assert calls == [True]  # the training forward only
    assert inputs["importance_sampling_ratio"].max().item() == pytest.approx(2.0)
    assert trainer._metrics["train"]["sampling/importance_sampling_ratio/max"] == [
        pytest.approx(2.0)
    ]


def test_stale_and_zero_weight_samples_do_not_contribute(loss_trainer, tiny_policy):
    model, tok = tiny_policy
    trainer, source = loss_trainer(max_staleness=4)
    trainer.state.global_step = 10  # the trainer holds version 10
    group = rollout_group(model, tok, "40+2", "42", policy=POLICY, group_size=4, version=10)
    a, b, c, d = group.samples
    a.advantage, b.advantage, c.advantage, d.advantage = 1.0, -1.0, 0.7, -0.4
    base, base_grads, _ = _loss(trainer, source, [_group([a, b])])

    c.weight = 0.0  # down-weighted to nothing by the dataflow
    d.versions = [2 if v >= 0 else v for v in d.versions]  # 8 versions old > max_staleness 4
    loss, grads, inputs = _loss(trainer, source, [_group([a, b, c, d])])
    assert loss.item() == pytest.approx(base.item(), abs=1e-6)
    assert torch.allclose(grads, base_grads, atol=1e-7)
    assert inputs["num_items_in_batch"].item() == sum(a.loss_mask) + sum(b.loss_mask)
    assert trainer._pending[1].skipped == {"zero_weight": 1, "stale": 1}

    # Without the bound the stale sample would have been trained on.
    d_weighted, _, _ = _loss(trainer, source, [_group([a, b, d])])
    trainer.max_staleness = None
    d_trained, _, _ = _loss(trainer, source, [_group([a, b, d])])
    assert d_weighted.item() != pytest.approx(d_trained.item(), abs=1e-6)


def test_fractional_weight_scales_advantage(loss_trainer, tiny_policy):
    model, tok = tiny_policy
    trainer, source = loss_trainer()
    group = rollout_group(model, tok, "5+5", "10", policy=POLICY, group_size=1, version=0)
    (s,) = group.samples
    s.advantage = 1.0
    full, _, _ = _loss(trainer, source, [_group([s])])
    s.weight = 0.25
    quarter, _, _ = _loss(trainer, source, [_group([s])])
    assert quarter.item() == pytest.approx(0.25 * full.item(), rel=1e-5)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo"])
def test_every_recipe_loss_type_gives_a_gradient(loss_trainer, tiny_policy, loss_type, tmp_path):
    model, tok = tiny_policy
    trainer, source = loss_trainer(extra={"loss_type": loss_type})
    assert trainer.loss_type == loss_type
    group = rollout_group(model, tok, "7+8", "15", policy=POLICY, group_size=2, version=0)
    group.samples[0].advantage, group.samples[1].advantage = 1.0, -0.5
    loss, grads, _ = _loss(trainer, source, [group])
    assert torch.isfinite(loss) and torch.isfinite(grads).all() and grads.abs().sum() > 0


def test_unscored_behaviour_tokens_get_no_correction(loss_trainer, tiny_policy):
    model, tok = tiny_policy
    group = rollout_group(model, tok, "9+9", "18", policy=POLICY, group_size=2, version=0)
    group.samples[0].advantage, group.samples[1].advantage = 1.0, -1.0
    for extra in ({}, {"vllm_importance_sampling_correction": False}):
        trainer, source = loss_trainer(extra=extra)
        exact, _, _ = _loss(trainer, source, [group])
        holes = group.model_copy(deep=True)
        first = holes.samples[0].prompt_length
        holes.samples[0].logprobs[first] = float("nan")
        loss, grads, inputs = _loss(trainer, source, [holes])
        assert torch.isfinite(inputs["sampling_per_token_logps"]).all()
        assert loss.item() == pytest.approx(exact.item(), abs=1e-5)
        assert torch.isfinite(grads).all()


def test_publish_every_k_steps_and_always_the_last(tmp_path, tiny_model_path, tiny_policy):
    model, tok = tiny_policy

    def producer(policy, num_groups, version):
        group = rollout_group(model, tok, "3+3", "6", policy=policy, group_size=4, version=0)
        return make_batch([group], policy, version)

    published = []
    source = InProcessBatchSource(producer=producer)
    cfg = TrainerConfig(groups_per_step=1, publish_every=2, checkpoint_every=100)
    trainer = build_trainer(
        tiny_model_path,
        cfg,
        source,
        tmp_path,
        POLICY,
        max_steps=3,
        publish=lambda v, sd: published.append(v),
        max_staleness=10,
    )
    assert trainer.run(resume=False) == 3
    assert published == [0, 2, 3]
    assert [a.trainer_version for a in source.acks] == [1, 2, 3]
    assert all(a.metrics["version_lag/max"] == a.trainer_version - 1 for a in source.acks)


def test_resume_on_the_same_batches_retrains_to_the_same_weights(
    tmp_path, tiny_model_path, tiny_policy
):
    """Exact resume: a trainer killed after step 4 restarts from checkpoint-2; served steps 3-4
    again (as the dataflow replays them), it publishes bit-identical weights, and it acks the
    checkpoint's own batch first (a step can be saved and killed before its ack)."""
    from astraflow.trainer.checkpoints import MARKER, newest_complete, read_mark
    from astraflow.weights import state_digest

    model, tok = tiny_policy
    batches = [
        make_batch(
            [
                rollout_group(model, tok, q, a, policy=POLICY, group_size=4, version=0)
                for q, a in arith_prompts(2, seed=i)
            ],
            POLICY,
            0,
        )
        for i in range(4)
    ]
    cfg = TrainerConfig(groups_per_step=2, learning_rate=1e-3, checkpoint_every=2)

    def train(source, max_steps, resume):
        digests: dict[int, str] = {}
        trainer = build_trainer(
            tiny_model_path, cfg, source, tmp_path, POLICY, max_steps=max_steps,
            publish=lambda v, state: digests.__setitem__(v, state_digest(state)),
        )  # fmt: skip
        trainer.run(resume=resume)
        return digests

    first = InProcessBatchSource()
    for b in batches:
        first.put(b)
    before = train(first, 4, resume=False)
    assert [(a.trainer_version, a.checkpoint_version) for a in first.acks] == [
        (1, 0), (2, 2), (3, 2), (4, 4)
    ]  # fmt: skip
    ckpts = tmp_path / "checkpoints" / POLICY
    assert read_mark(ckpts / "checkpoint-2").batch_id == batches[1].id
    # checkpoint-4 was being written when the trainer died: no marker, so it is not trusted
    (ckpts / "checkpoint-4" / MARKER).unlink()
    assert newest_complete(ckpts)[0].name == "checkpoint-2"
    assert not (ckpts / "checkpoint-4").exists()

    replay = InProcessBatchSource()
    for b in batches[2:]:
        replay.put(b)
    after = train(replay, 4, resume=True)
    assert [a.batch_id for a in replay.acks] == [b.id for b in batches[1:]]
    assert [a.trainer_version for a in replay.acks] == [2, 3, 4]
    assert {v: after[v] for v in (2, 3, 4)} == {v: before[v] for v in (2, 3, 4)}


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is false)"
)
def test_one_step_on_cuda_publishes_moved_weights(tmp_path, tiny_model_path, tiny_policy):
    """The same trainer code on a GPU (``trainer.device = "cuda"``, dtype auto): the model sits
    on CUDA, one real step has a finite loss and a gradient, and version 1 differs from 0."""
    _, tok = tiny_policy
    generator = _fresh_generator(tiny_model_path)  # CPU rollouts, as a rollout node makes them
    torch.manual_seed(0)

    producer = arith_producer(generator, tok)

    published: dict[int, dict[str, torch.Tensor]] = {}

    def publish(version, state_dict):
        published[version] = {k: v.detach().float().cpu().clone() for k, v in state_dict.items()}

    source = InProcessBatchSource(producer=producer)
    cfg = TrainerConfig(groups_per_step=2, learning_rate=1e-3, device="cuda")
    trainer = build_trainer(
        tiny_model_path, cfg, source, tmp_path, POLICY, max_steps=1, publish=publish
    )
    assert {p.device.type for p in trainer.model.parameters()} == {"cuda"}
    assert trainer.run(resume=False) == 1
    [ack] = source.acks
    assert math.isfinite(ack.metrics["loss"]) and ack.metrics["grad_norm"] > 0
    assert sorted(published) == [0, 1]
    assert any(not torch.equal(published[0][k], published[1][k]) for k in published[0])
