"""Turn a :class:`~astraflow.protocol.Batch` of samples into the padded tensors TRL's loss reads.

Why a module of its own: this is where token-in/token-out is kept honest. Every sample's tokens are
used exactly as the rollout engine produced them (never re-tokenized), split at the first generated
token into a prompt (left-padded, as TRL expects) and a completion (right-padded). Inside the
completion the sample's loss mask becomes TRL's ``tool_mask``: environment/tool/other-role tokens
stay visible to attention (``completion_mask`` = 1) but carry no loss. Using the loss mask as the
``completion_mask`` instead would hide observations from the tokens generated after them.

Advantages are the dataflow's when it computed them, otherwise GRPO's group-normalised rewards
computed by the same functions (:mod:`astraflow.protocol.advantages`); the staleness weight
multiplies each sample's advantage, and weight-0 samples get an all-zero loss mask so they add
nothing to the loss or to the token normalisers. With ``turn_discount`` (``trainer.turn_discount``)
the advantages are per token: each generated turn's tokens get that turn's group-normalised
discounted return (:func:`~astraflow.protocol.advantages.turn_advantages`), a (B, C) tensor that
TRL's loss takes as it is.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field

import torch

from astraflow.protocol import Batch, Group, Sample
from astraflow.protocol.advantages import (
    ScaleRewards,
    advantages,
    reward_std,
    sample_turn_rewards,
    turn_advantages,
    turn_returns,
)
from astraflow.protocol.arrays import generated_runs


@dataclass
class CollatedBatch:
    """Padded tensors for one batch, rows in the batch's sample order."""

    prompt_ids: torch.Tensor  # (B, P) left-padded
    prompt_mask: torch.Tensor  # (B, P)
    completion_ids: torch.Tensor  # (B, C) right-padded
    completion_mask: torch.Tensor  # (B, C) 1 on every real completion token (attention)
    loss_mask: torch.Tensor  # (B, C) 1 on tokens the policy generated and that are trained on
    behaviour_logps: torch.Tensor  # (B, C) log-probs the behaviour policy gave its tokens
    #: (B,) advantage x staleness weight; (B, C) per token with turn-level credit
    advantages: torch.Tensor
    rewards: torch.Tensor  # (B,)
    weights: torch.Tensor  # (B,) effective weight (0 = not trained on)
    version_lag: torch.Tensor  # (B,) trainer_version - oldest generating version
    group_index: torch.Tensor  # (B,) which group of the batch each row belongs to
    skipped: Counter = field(default_factory=Counter)  # samples given weight 0, by reason
    #: quarantined samples (id -> why): not in the tensors at all; the ack reports them
    invalid: dict[str, str] = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return int(self.prompt_ids.shape[0])

    @property
    def trained_rows(self) -> int:
        return int((self.weights > 0).sum())


def group_advantages(group: Group, scale_rewards: ScaleRewards, batch_std: float) -> list[float]:
    """Per-sample advantages of one group.

    The dataflow's values when any is non-zero (the dataflow computes advantages as it forms a
    batch; an all-zero group carries no signal either way), otherwise the same function on the
    rewards, for a batch built in process: ``(r - mean(group)) / (std + 1e-4)``, std taken over
    the group (``group``), the whole batch (``batch``) or not at all (``none``).
    """
    provided = [s.advantage for s in group.samples]
    if any(a != 0.0 for a in provided):
        return provided
    return advantages([s.reward for s in group.samples], scale_rewards, batch_std=batch_std)


def sample_problem(sample: Sample, policy: str, vocab_size: int | None) -> str | None:
    """Why this trainer cannot train on ``sample`` (None: it can).

    Defence in depth behind the dataflow's checks at the door: a sample that would crash the
    step (an id outside the embedding, no prompt token) is quarantined, never trained on."""
    if sample.policy != policy:
        return f"belongs to policy {sample.policy!r} but this trainer trains {policy!r}"
    if not sample.tokens:
        return "has no tokens"
    for name in ("loss_mask", "logprobs", "versions"):
        if len(getattr(sample, name)) != len(sample.tokens):
            return f"{name} has {len(getattr(sample, name))} entries but tokens has {len(sample.tokens)}"
    if vocab_size is not None:
        bad = [t for t in sample.tokens if t < 0 or t >= vocab_size]
        if bad:
            return (
                f"has token ids outside the model vocabulary [0, {vocab_size}): {bad[:5]}; were "
                "the samples produced by a different model or tokenizer?"
            )
    if sample.prompt_length == 0:
        return (
            "starts with a generated token; at least one prompt token is needed to score the "
            "first generated token"
        )
    return None


def collate_batch(
    batch: Batch,
    *,
    policy: str,
    pad_token_id: int,
    trainer_version: int,
    scale_rewards: ScaleRewards = "group",
    max_staleness: int | None = None,
    vocab_size: int | None = None,
    pad_rows_to_multiple_of: int = 1,
    min_rows: int = 1,
    turn_discount: float | None = None,
) -> CollatedBatch:
    """Padded training tensors of ``batch`` (see the module docstring for the conventions).

    A sample this trainer cannot train on (:func:`sample_problem`) is quarantined: left out of
    the tensors and of its group's baseline, counted as ``skipped["invalid_sample"]`` and listed
    in ``invalid`` for the ack. Other samples are never dropped silently: a sample older than
    ``max_staleness`` versions, one with weight 0, or one without any generated token stays in the
    batch (its group's baseline still counts its reward) with an all-zero loss mask, and is
    counted in ``skipped`` by reason.
    ``pad_rows_to_multiple_of`` and ``min_rows`` append inert rows so TRL can split the batch into
    equal micro-batches (its splitter drops remainders) and every process holds the same number of
    rows (TRL gathers per-row statistics across processes).
    """
    samples = batch.samples
    batch_std = reward_std([s.reward for s in samples])
    turn_mode = turn_discount is not None
    #: per sample id: its runs of generated tokens and their discounted returns (turn mode)
    turns: dict[str, tuple[list[tuple[int, int]], list[float]]] = {}
    if turn_mode:
        for smp in samples:
            runs = generated_runs(smp.loss_mask)
            per_turn = sample_turn_rewards(smp.turn_rewards, smp.reward, len(runs))
            turns[smp.id] = (runs, turn_returns(per_turn, float(turn_discount)))
        batch_std = reward_std([g for _runs, returns in turns.values() for g in returns])
    token_advs: list[list[float]] = []

    prompts: list[list[int]] = []
    completions: list[list[int]] = []
    loss_masks: list[list[int]] = []
    behaviour: list[list[float]] = []
    advantages: list[float] = []
    rewards: list[float] = []
    weights: list[float] = []
    lags: list[int] = []
    group_index: list[int] = []
    skipped: Counter = Counter()
    invalid: dict[str, str] = {}

    for gi, group in enumerate(batch.groups):
        bad = {
            smp.id: problem
            for smp in group.samples
            if (problem := sample_problem(smp, policy, vocab_size)) is not None
        }
        if bad:  # quarantined: out of the step and of its group's baseline, reported in the ack
            invalid.update(bad)
            skipped["invalid_sample"] += len(bad)
            group = group.model_copy(
                update={"samples": [smp for smp in group.samples if smp.id not in bad]}
            )
        advs: list = group_advantages(group, scale_rewards, batch_std)
        if turn_mode:
            advs = turn_advantages(
                [turns[smp.id][1] for smp in group.samples], scale_rewards, batch_std=batch_std
            )
        for sample, adv in zip(group.samples, advs, strict=True):
            pl = sample.prompt_length
            lag = trainer_version - sample.min_version if sample.min_version >= 0 else 0
            weight = float(sample.weight)
            if pl >= len(sample.tokens):
                weight, reason = 0.0, "no_generated_tokens"
            elif max_staleness is not None and lag > max_staleness:
                weight, reason = 0.0, "stale"
            elif weight == 0.0:
                reason = "zero_weight"
            else:
                reason = None
            if reason is not None:
                skipped[reason] += 1
            prompts.append(list(sample.tokens[:pl]))
            completion = list(sample.tokens[pl:]) or [pad_token_id]
            completions.append(completion)
            mask = list(sample.loss_mask[pl:]) if weight > 0 else [0] * len(completion)
            loss_masks.append(mask or [0])
            behaviour.append(list(sample.logprobs[pl:]) or [0.0])
            if turn_mode:  # each turn's tokens get that turn's advantage
                per_token = [0.0] * len(completion)
                for (start, end), turn_adv in zip(turns[sample.id][0], adv, strict=True):
                    per_token[start - pl : end - pl] = [turn_adv * weight] * (end - start)
                token_advs.append(per_token)
                adv = statistics.fmean(adv) if adv else 0.0
            advantages.append(adv * weight)
            rewards.append(sample.reward)
            weights.append(weight)
            lags.append(lag)
            group_index.append(gi)

    real_rows = len(prompts)
    # Inert rows (one pad prompt token, one masked completion token) to reach a multiple (and at
    # least one row: a process whose share of the groups is empty still takes part in the step).
    while len(prompts) < max(1, min_rows) or len(prompts) % max(1, pad_rows_to_multiple_of):
        prompts.append([pad_token_id])
        completions.append([pad_token_id])
        loss_masks.append([0])
        behaviour.append([0.0])
        advantages.append(0.0)
        token_advs.append([0.0])
        rewards.append(float("nan"))
        weights.append(0.0)
        lags.append(0)
        group_index.append(-1)

    n = len(prompts)
    p_len = max(len(p) for p in prompts)
    c_len = max(len(c) for c in completions)
    prompt_ids = torch.full((n, p_len), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((n, p_len), dtype=torch.long)
    completion_ids = torch.full((n, c_len), pad_token_id, dtype=torch.long)
    completion_mask = torch.zeros((n, c_len), dtype=torch.long)
    loss_mask = torch.zeros((n, c_len), dtype=torch.long)
    behaviour_logps = torch.zeros((n, c_len), dtype=torch.float32)
    for i in range(n):
        p, c = prompts[i], completions[i]
        prompt_ids[i, p_len - len(p) :] = torch.tensor(p, dtype=torch.long)
        prompt_mask[i, p_len - len(p) :] = 1
        completion_ids[i, : len(c)] = torch.tensor(c, dtype=torch.long)
        completion_mask[i, : len(c)] = 1
        loss_mask[i, : len(c)] = torch.tensor(loss_masks[i], dtype=torch.long)
        behaviour_logps[i, : len(c)] = torch.tensor(behaviour[i], dtype=torch.float32)
    # Padding rows added above attend to one pad token only; keep their completion out of attention.
    for i in range(real_rows, n):
        completion_mask[i] = 0
    advantage_tensor = torch.tensor(advantages, dtype=torch.float32)
    if turn_mode:
        advantage_tensor = torch.zeros((n, c_len), dtype=torch.float32)
        for i, row in enumerate(token_advs):
            advantage_tensor[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return CollatedBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        loss_mask=loss_mask,
        # NaN (an engine that could not score a token) survives on trained tokens only.
        behaviour_logps=torch.where(loss_mask.bool(), behaviour_logps, 0.0),
        advantages=advantage_tensor,
        rewards=torch.tensor(rewards, dtype=torch.float32),
        weights=torch.tensor(weights, dtype=torch.float32),
        version_lag=torch.tensor(lags, dtype=torch.long),
        group_index=torch.tensor(group_index, dtype=torch.long),
        skipped=skipped,
        invalid=invalid,
    )


def micro_batch_rows(
    prompt_lengths: list[int], completion_lengths: list[int], budget: int
) -> list[list[int]]:
    """Row indices of a batch grouped into micro-batches of at most ``budget`` padded tokens.

    A micro-batch is padded to its longest prompt plus its longest completion, so its cost is
    rows x (max prompt + max completion); that is what one forward with gradients holds in
    activations. Rows are taken longest first, and each micro-batch takes rows while the padded
    size stays within the budget, so rows of similar length share a micro-batch and little
    padding is computed. A row longer than the budget is a micro-batch of its own (it cannot be
    split: its tokens attend to each other). Which rows share a micro-batch does not change the
    accumulated gradient (:meth:`~astraflow.trainer.grpo.AstraGRPOTrainer.compute_loss`). The
    trainer passes the batch's prompt width as every row's prompt length: it keeps the
    left-padded prompt columns whole (see ``AstraGRPOTrainer._split_micro_batches``).
    """
    if budget <= 0:
        raise ValueError(f"micro-batch budget must be > 0 tokens, got {budget}")
    if len(prompt_lengths) != len(completion_lengths):
        raise ValueError("one prompt and one completion length per row")
    order = sorted(
        range(len(prompt_lengths)),
        key=lambda i: (-(prompt_lengths[i] + completion_lengths[i]), i),
    )
    groups: list[list[int]] = []
    current: list[int] = []
    width_p = width_c = 0
    for i in order:
        p, c = max(prompt_lengths[i], 1), max(completion_lengths[i], 1)
        wp, wc = max(width_p, p), max(width_c, c)
        if current and (len(current) + 1) * (wp + wc) > budget:
            groups.append(current)
            current, wp, wc = [], p, c
        current.append(i)
        width_p, width_c = wp, wc
    if current:
        groups.append(current)
    return groups
