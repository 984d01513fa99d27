"""The trainer core: TRL's ``GRPOTrainer`` fed by the dataflow instead of by its own generation.

Why subclass TRL rather than write a loss: TRL already has the GRPO-family losses (grpo, dr_grpo,
dapo, bnpo, cispo, sapo, ...), the optimizer/scheduler, accelerate/DeepSpeed/FSDP handling, logging
and checkpoint/resume. Only the batch producer differs in AstraFlow, so only
``_generate_and_score_completions`` is replaced, and ``compute_loss`` runs TRL's ``_compute_loss``
per micro-batch (private TRL API: ``trl`` is pinned and ``tests/trainer/test_trl_contract.py``
and ``tests/trainer/test_micro_batches.py`` fail loudly if it changes).

What the override feeds TRL (one batch = one optimizer step; ``num_iterations`` is 1):

* ``prompt_ids``/``prompt_mask`` (left-padded) and ``completion_ids``/``completion_mask``
  (right-padded) straight from the samples' tokens, never re-tokenized;
* ``tool_mask`` = the samples' loss mask over the completion: env/tool tokens stay in attention but
  carry no loss (TRL multiplies ``completion_mask * tool_mask`` for the loss and its normalisers);
* ``advantages``: group-normalised (or the dataflow's) advantage x staleness weight (per token
  with ``trainer.turn_discount``: each turn's normalised discounted return), and, with the
  off-policy correction on (default), x the truncated importance ratio
  ``min(pi_prox / pi_behaviour, cap)`` per token, computed exactly as TRL's
  ``vllm_importance_sampling_*`` path would (modes ``token_truncate`` (default), ``token_mask``,
  ``sequence_truncate``, ``sequence_mask``). Multiplying the advantage by a non-negative weight
  equals TRL's ``per_token_loss * importance_sampling_ratio`` for every supported loss;
* ``old_per_token_logps`` = the proximal policy (the weights being updated) so PPO clipping is
  measured against them, and ``sampling_per_token_logps`` = the behaviour log-probs (TRL's
  off-policy sequence mask reads them when ``off_policy_mask_threshold`` is set). There is no
  separate proximal forward pass: with one optimizer step per batch the proximal log-probs are the
  loss forward's own, detached, so the ratio is folded in during that forward
  (``_correct_with_behaviour``), which saves one forward per step;
* with ``vllm_importance_sampling_correction = false`` in ``[trainer.extra]`` the behaviour
  log-probs themselves become ``old_per_token_logps``, so TRL's PPO ratio is
  ``pi_theta / pi_behaviour``, clipped at ``epsilon``.

One optimizer step is computed micro-batch by micro-batch (``trainer.micro_batch_tokens``,
:meth:`AstraGRPOTrainer.compute_loss`): each micro-batch's loss is weighted by its share of the
batch's normaliser, so the accumulated gradient is the one-pass gradient for every loss type,
while no forward holds more than the budget's padded tokens. The parameters are float32 master
weights whatever ``trainer.dtype`` says; bfloat16/float16 are autocast compute dtypes and the
dtype weights are published in (:func:`_resolve_dtype`).

After every optimizer step (in ``_maybe_log_save_evaluate``, i.e. after logging and any checkpoint
save): publish the new version when due, then acknowledge the batch with the version and the step's
metrics, then call ``on_step``. Publishing first means the version exists in the weight store by
the time the dataflow learns of it. ``version == global_step``, so it continues across resume.

Under accelerate/torchrun only the main process talks to the source and the publisher: it pulls the
batch and broadcasts it, every process trains on its share of the groups (padded with inert rows
to equal size, as TRL's cross-process statistics need), and the main process acknowledges.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback
from trl import GRPOConfig, GRPOTrainer

from astraflow.models.lora import TRAINER_ADAPTER, AdapterSpec, peft_lora_config
from astraflow.protocol import Batch
from astraflow.protocol.ranks import RankPayload
from astraflow.recipe.schema import TrainerConfig
from astraflow.trainer.checkpoints import CheckpointMark, newest_complete, write_mark
from astraflow.trainer.rank_share import share_from_main
from astraflow.trainer.samples import CollatedBatch, collate_batch
from astraflow.trainer.source import BatchSource, SourceExhausted

#: ``publish(version, state_dict)``: tensors are live views, valid only during the call.
PublishFn = Callable[[int, dict[str, torch.Tensor]], None]

#: GRPOConfig keys that would make TRL generate or reuse batches; AstraFlow forbids them.
_FORBIDDEN_EXTRA = {
    "use_vllm": False,
    "num_iterations": 1,
    "use_transformers_continuous_batching": False,
}

#: TRL's gradient accumulation (equal row slices of a batch, each normalised on its own), refused
#: in ``trainer.extra``: :meth:`AstraGRPOTrainer.compute_loss` accumulates micro-batches sized by
#: ``trainer.micro_batch_tokens`` with the whole batch's normalisation instead.
_ACCUMULATION_KEYS = ("gradient_accumulation_steps", "steps_per_generation")


@dataclass
class StepReport:
    """What one committed optimizer step did (given to ``on_step``)."""

    version: int
    batch_id: str
    published: bool
    metrics: dict[str, float]
    skipped: dict[str, int] = field(default_factory=dict)
    dropped_by_dataflow: dict[str, int] = field(default_factory=dict)


def _rewards_come_from_the_dataflow(prompts: Any = None, completions: Any = None, **_: Any) -> list:
    """Placeholder reward function: TRL requires one, but rewards arrive with the samples."""
    raise RuntimeError("AstraGRPOTrainer never scores completions; rewards come with the samples")


class _PublishOnStart(TrainerCallback):
    """Publishes the weights the run starts from (version 0, or the resumed step)."""

    def __init__(self, trainer: AstraGRPOTrainer) -> None:
        self._trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        self._trainer._publish(state.global_step)


class AstraGRPOTrainer(GRPOTrainer):
    """``trl.GRPOTrainer`` whose batches come from a :class:`BatchSource`.

    TRL's dataloader still drives the loop, over a placeholder dataset of empty prompts that the
    batch producer ignores; ``max_steps`` in ``args`` sets the length of training.
    """

    #: M2PO second-moment bound (``trainer.off_policy = "m2po"``); None: TRL's truncation
    m2po_threshold: float | None = None
    #: the policy is a LoRA adapter of a base (``policies.X.base``): its versions are the
    #: adapter's tensors alone, not merged weights
    adapter_only: bool = False
    #: turn-level credit (``trainer.turn_discount``): per-token advantages from per-turn returns
    turn_discount: float | None = None
    #: token budget of one forward+backward (``trainer.micro_batch_tokens``); None: the whole
    #: batch in one pass
    micro_batch_tokens: int | None = None

    def __init__(
        self,
        *,
        model: Any,
        args: GRPOConfig,
        processing_class: Any,
        source: BatchSource,
        policy: str,
        groups_per_step: int,
        publish: PublishFn | None = None,
        on_step: Callable[[StepReport], None] | None = None,
        publish_every: int = 1,
        publish_on_start: bool = True,
        max_staleness: int | None = None,
        callbacks: list[TrainerCallback] | None = None,
        peft_config: Any = None,
    ) -> None:
        from datasets import Dataset

        for key, required in _FORBIDDEN_EXTRA.items():
            if getattr(args, key) != required:
                raise ValueError(
                    f"GRPOConfig.{key}={getattr(args, key)!r} is not supported by the AstraFlow trainer "
                    f"(batches come from the dataflow, one optimizer step each); expected {required!r}"
                )
        if args.gradient_accumulation_steps != 1 or args.steps_per_generation != 1:
            raise ValueError(
                "gradient_accumulation_steps and steps_per_generation must be 1 (one pulled batch "
                "per optimizer step, accumulated over micro-batches of micro_batch_tokens by the "
                f"trainer itself); got {args.gradient_accumulation_steps} and "
                f"{args.steps_per_generation}"
            )
        self.source = source
        self.policy = policy
        self.groups_per_step = groups_per_step
        self.publish_fn = publish
        self.on_step = on_step
        self.publish_every = publish_every
        self.max_staleness = max_staleness
        self._pending: tuple[Batch, CollatedBatch, float] | None = None
        self._correcting: dict[str, Any] | None = None  # the micro-batch whose loss is computing
        self._last_logs: dict[str, float] = {}
        self._committed_step = -1
        self._published: set[int] = set()
        #: newest version a restart could resume from (0: the initial weights; see BatchAck)
        self._checkpoint_version = 0
        # Enough placeholder rows for TRL's RepeatSampler to fill one generation batch per step.
        rows = max(1, args.generation_batch_size // args.num_generations)
        placeholder = Dataset.from_dict({"prompt": [""] * rows * 64})
        all_callbacks = list(callbacks or [])
        super().__init__(
            model=model,
            reward_funcs=[_rewards_come_from_the_dataflow],
            args=args,
            train_dataset=placeholder,
            processing_class=processing_class,
            callbacks=all_callbacks,
            peft_config=peft_config,
        )
        self._committed_step = self.state.global_step
        self.current_gradient_accumulation_steps = args.gradient_accumulation_steps
        self.remove_callback(PrinterCallback)  # metrics go to on_step/acks, not to stdout
        if publish_on_start:
            self.add_callback(_PublishOnStart(self))

    # ------------------------------------------------------------------ batch production

    @property
    def version(self) -> int:
        """Version of the weights held now (= optimizer steps taken, across resumes)."""
        return int(self.state.global_step)

    def model_facts(self) -> dict[str, int | None]:
        """What the dataflow service checks pushed tokens against (announced with each
        version): the vocabulary size and, when the model has one, its context length."""
        config = self.model.config.get_text_config()
        positions = getattr(config, "max_position_embeddings", None)
        return {
            "vocab_size": int(config.vocab_size),
            "context_length": int(positions) if isinstance(positions, int) else None,
        }

    def _fetch_batch(self) -> tuple[Batch, CollatedBatch]:
        """Pull (main process), share with every process, collate this process's groups."""
        world = self.accelerator.num_processes
        rank = self.accelerator.process_index
        vocab = self.model.config.get_text_config().vocab_size
        while True:
            payload: RankPayload | None = None
            if self.accelerator.is_main_process:
                try:
                    payload = RankPayload(
                        "ok",
                        self.source.next_batch(self.policy, self.groups_per_step, self.version),
                    )
                except SourceExhausted as exc:
                    payload = RankPayload("exhausted", message=str(exc))
                except Exception as exc:  # shared so that no process waits forever
                    if world == 1:
                        raise
                    payload = RankPayload("error", message=f"{type(exc).__name__}: {exc}")
            if world > 1:
                payload = share_from_main(payload, device=self.accelerator.device)
            assert payload is not None
            if payload.kind == "exhausted":
                raise SourceExhausted(payload.message)
            if payload.kind == "error":
                raise RuntimeError(f"batch source failed on the main process: {payload.message}")
            assert payload.batch is not None
            batch: Batch = payload.batch
            local = batch.model_copy(update={"groups": batch.groups[rank::world]})
            # Every process must hold the same number of rows; all know every share's size.
            rows = max(sum(len(g.samples) for g in batch.groups[r::world]) for r in range(world))
            collated = collate_batch(
                local,
                policy=self.policy,
                pad_token_id=self._tokenizer.pad_token_id,
                trainer_version=self.version,
                scale_rewards=self.scale_rewards,
                max_staleness=self.max_staleness,
                vocab_size=vocab,
                pad_rows_to_multiple_of=self.args.steps_per_generation,
                min_rows=rows,
                turn_discount=self.turn_discount,
            )
            trainable = torch.tensor(
                float(collated.loss_mask.sum()), device=self.accelerator.device
            )
            if float(self.accelerator.gather(trainable).sum()) > 0:
                return batch, collated
            # Nothing to train on (every sample stale / weight 0): acknowledge without a step.
            if self.accelerator.is_main_process:
                self.source.ack(
                    batch.id,
                    self.version,
                    {
                        "skipped_batch": 1.0,
                        **{f"skipped/{k}": float(v) for k, v in collated.skipped.items()},
                    },
                    trained=False,
                    checkpoint_version=self._checkpoint_version,
                    invalid_samples=collated.invalid,
                )

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        if not self.model.training:
            raise RuntimeError(
                "AstraGRPOTrainer does not evaluate; evaluation runs through `astraflow eval`"
            )
        started = time.perf_counter()
        batch, c = self._fetch_batch()
        waited = time.perf_counter() - started
        device = self.accelerator.device
        prompt_ids = c.prompt_ids.to(device)
        prompt_mask = c.prompt_mask.to(device)
        completion_ids = c.completion_ids.to(device)
        completion_mask = c.completion_mask.to(device)
        loss_mask = c.loss_mask.to(device)
        behaviour = c.behaviour_logps.to(device)
        advantages = c.advantages.to(device)
        num_items_in_batch = self.accelerator.gather(loss_mask.sum()).sum()

        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        logits_to_keep = completion_ids.size(1)
        # the reference pass (no gradient) goes in row chunks within the token budget too
        chunk = max(1, (self.micro_batch_tokens or input_ids.numel()) // input_ids.size(1))
        mode = "train"
        metrics = self._metrics[mode]

        no_checkpointing = contextlib.nullcontext()
        if self.args.activation_checkpointing:
            from trl.models.utils import disable_gradient_checkpointing

            no_checkpointing = disable_gradient_checkpointing(
                self.model, self.args.gradient_checkpointing_kwargs
            )
        output: dict[str, Any] = {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "completion_ids": completion_ids,
            "completion_mask": completion_mask,
            "tool_mask": loss_mask,
            "num_items_in_batch": num_items_in_batch,
        }
        missing = ~torch.isfinite(behaviour)
        metrics["sampling/missing_behaviour_logps"].append(float(missing.sum()))
        # The behaviour log-probs ride along under TRL's own key: its off-policy mask reads them.
        output["sampling_per_token_logps"] = behaviour
        output["advantages"] = advantages
        if not self.vllm_importance_sampling_correction:
            # PPO ratio pi_theta / pi_behaviour; an unscored token gets ratio 1 via its own logp,
            # filled in by _correct_with_behaviour from the loss forward.
            output["old_per_token_logps"] = behaviour
        # With the correction on there is no proximal pass here: one optimizer step per batch
        # means the proximal log-probs *are* the loss forward's own, detached, so the ratio is
        # folded in by ``_correct_with_behaviour`` during that forward (TRL then uses
        # per_token_logps.detach() as old_per_token_logps, exactly the proximal policy).
        with torch.no_grad(), no_checkpointing:
            if self.beta != 0.0 and self.ref_model is not None:
                ref, _, _ = self._get_per_token_logps_and_entropies(
                    self.ref_model, input_ids, attention_mask, logits_to_keep, batch_size=chunk
                )
                output["ref_per_token_logps"] = ref

        # Fixed-size stat vectors: processes hold different numbers of rows.
        real = c.group_index >= 0
        r = c.rewards[real].double()
        lens = c.loss_mask.sum(1)[real].double()
        lag = c.version_lag[real].double()
        local = torch.tensor(
            [
                float(r.numel()),
                float(r.sum()),
                float((r * r).sum()),
                float(lens.sum()),
                float(c.trained_rows),
                float(lag.sum()),
            ],
            dtype=torch.float64,
            device=device,
        )
        n, r_sum, r_sq, len_sum, trained, lag_sum = (
            self.accelerator.gather(local).view(-1, 6).sum(0).tolist()
        )
        maxima = torch.tensor(
            [float(lens.max()) if lens.numel() else 0.0, float(lag.max()) if lag.numel() else 0.0],
            device=device,
        )
        len_max, lag_max = self.accelerator.gather(maxima).view(-1, 2).max(0).values.tolist()
        mean = r_sum / max(n, 1.0)
        var = (r_sq - n * mean * mean) / (n - 1) if n > 1 else 0.0
        metrics["reward"].append(mean)
        metrics["reward_std"].append(math.sqrt(max(var, 0.0)))
        metrics["completions/mean_length"].append(len_sum / max(n, 1.0))
        metrics["completions/max_length"].append(len_max)
        metrics["samples"].append(n)
        metrics["samples/trained"].append(trained)
        metrics["tokens"].append(float(num_items_in_batch))
        metrics["batch_wait_s"].append(waited)
        metrics["version_lag/mean"].append(lag_sum / max(n, 1.0))
        metrics["version_lag/max"].append(lag_max)
        self._pending = (batch, c, started)
        return output

    def compute_loss(
        self,
        model: Any,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> torch.Tensor:
        """The whole batch's loss, computed micro-batch by micro-batch within
        ``micro_batch_tokens`` (:func:`~astraflow.trainer.samples.micro_batch_rows`).

        Why here and not with TRL's gradient accumulation: TRL splits a batch into equal row
        slices and normalises each on its own (a per-token loss then weights the slices equally
        whatever their token counts), and its number of slices is fixed in the config, while a
        token budget needs as many micro-batches as the rows' lengths ask for.

        Every micro-batch but the last is backpropagated here (outside DDP's gradient sync);
        the last one's loss is returned for the Trainer's own ``backward``, plus the others'
        detached values so that the logged loss is the batch's. Gradients therefore accumulate
        to exactly those of the one-batch loss: each micro-batch's TRL loss is weighted by its
        share of the batch's normaliser (:meth:`_micro_batch_share`). A caller that only wants
        a value (no gradient) gets the sum of the weighted micro-batch losses.
        """
        if return_outputs:
            raise ValueError("The GRPOTrainer does not support returning outputs")
        parts = self._split_micro_batches(inputs)
        if len(parts) == 1:
            return self._compute_loss(model, inputs)
        mask = inputs["completion_mask"] * inputs["tool_mask"]
        totals = (float(mask.size(0)), float(mask.sum()))
        backprop = torch.is_grad_enabled() and model.training
        done = None
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            sync = contextlib.nullcontext() if last or not backprop else self._no_sync(model)
            with sync:
                loss = self._weighted_loss(model, part, totals)
                if not last and backprop:
                    self.accelerator.backward(loss)
            if not last:
                loss = loss.detach()
                done = loss if done is None else done + loss
        return loss + done

    @contextlib.contextmanager
    def _no_sync(self, model: Any):
        """No gradient all-reduce (DDP) and no optimizer step (DeepSpeed's ``backward`` steps
        when gradients sync) for a micro-batch that is not the step's last."""
        state = self.accelerator.gradient_state
        before = state.sync_gradients
        state._set_sync_gradients(False)
        try:
            with self.accelerator.no_sync(model):
                yield
        finally:
            state._set_sync_gradients(before)

    def _split_micro_batches(self, inputs: dict[str, Any]) -> list[dict[str, Any]]:
        """``inputs`` cut into micro-batches of at most ``micro_batch_tokens`` padded tokens,
        each trimmed to its own longest completion (right padding: only padding goes).

        The prompts keep the batch's width: they are left-padded, and models number positions
        from the first column whatever the mask, so trimming their padding would shift every
        position of a row. With rotary positions that changes the result only by rounding, but
        then a micro-batch's log-probs would not be bit for bit those of the one-batch pass;
        kept as they are, they are (each row's computation does not depend on the others)."""
        from astraflow.trainer.samples import micro_batch_rows

        budget = self.micro_batch_tokens
        if budget is None:
            return [inputs]
        rows = inputs["prompt_ids"].size(0)
        width = inputs["completion_ids"].size(1)
        prompt_width = inputs["prompt_ids"].size(1)
        completion_lens = inputs["completion_mask"].sum(1)
        groups = micro_batch_rows([prompt_width] * rows, completion_lens.tolist(), budget)
        if len(groups) == 1:
            return [inputs]
        parts = []
        for group in groups:
            index = torch.tensor(group, device=inputs["prompt_ids"].device)
            keep = max(1, int(completion_lens[index].max()))
            part: dict[str, Any] = {}
            for key, value in inputs.items():
                if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.size(0) != rows:
                    part[key] = value
                    continue
                value = value.index_select(0, index)
                if not key.startswith("prompt_") and value.dim() == 2 and value.size(1) == width:
                    value = value[:, :keep]
                part[key] = value
            parts.append(part)
        return parts

    def _micro_batch_share(self, part: dict[str, Any], totals: tuple[float, float]) -> float:
        """The fraction of the batch's loss normaliser that ``part`` holds: its rows for the
        losses TRL normalises per sequence then averages over rows (grpo, sapo, luspo) or by
        rows x max_completion_length (dr_grpo); its loss tokens for those normalised by the
        batch's loss tokens (bnpo: this process's; dapo, cispo, vespo: ``num_items_in_batch``,
        every process's)."""
        rows, tokens = totals
        if self.loss_type in ("grpo", "sapo", "luspo", "dr_grpo"):
            return part["completion_ids"].size(0) / rows
        if self.loss_type in ("bnpo", "dapo", "cispo", "vespo"):
            mask = part["completion_mask"] * part["tool_mask"]
            return float(mask.sum()) / max(tokens, 1.0)
        raise ValueError(f"no micro-batch normalisation for loss_type {self.loss_type!r}")

    def _weighted_loss(
        self, model: Any, part: dict[str, Any], totals: tuple[float, float]
    ) -> torch.Tensor:
        """TRL's loss of one micro-batch, weighted to its share of the batch's loss.

        TRL divides every term of its loss (policy, entropy bonus, MoE auxiliary loss) by
        ``current_gradient_accumulation_steps``, and the token-normalised losses also by
        ``num_items_in_batch``; setting the first to 1/share and the second to the batch's
        count x share makes the policy and KL terms exactly the micro-batch's part of the
        one-batch loss. The entropy bonus and auxiliary loss become the micro-batch's mean
        weighted by that same share (rows or tokens): exact for the token-normalised losses, a
        row-weighted mean of micro-batch means for the per-sequence ones. A micro-batch with
        no loss tokens keeps its graph (DDP needs every parameter's gradient) at weight 0.
        """
        share = self._micro_batch_share(part, totals)
        scale = 1.0
        if share <= 0.0:
            share, scale = 1.0, 0.0
        part = dict(part)
        if "num_items_in_batch" in part:
            part["num_items_in_batch"] = part["num_items_in_batch"] * share
        saved = self.current_gradient_accumulation_steps
        self.current_gradient_accumulation_steps = 1.0 / share
        try:
            loss = self._compute_loss(model, part)
        finally:
            self.current_gradient_accumulation_steps = saved
        return loss * scale if scale != 1.0 else loss

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        self._correcting = inputs
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._correcting = None

    def _get_per_token_logps_and_entropies(self, model: Any, *args: Any, **kwargs: Any) -> Any:
        logps, entropies, aux = super()._get_per_token_logps_and_entropies(model, *args, **kwargs)
        inputs = getattr(self, "_correcting", None)
        if inputs is not None and torch.is_grad_enabled():
            self._correcting = None  # only the loss forward of the policy itself
            self._correct_with_behaviour(inputs, logps.detach())
        return logps, entropies, aux

    def _correct_with_behaviour(self, inputs: dict[str, Any], proximal: torch.Tensor) -> None:
        """Fold the behaviour log-probs into this micro-batch, between TRL's forward and its loss.

        TRL's ``_compute_loss`` reads ``advantages``, ``old_per_token_logps`` and
        ``importance_sampling_ratio`` only after its forward pass, so setting them here gives the
        same loss as a separate no-grad proximal pass would (one optimizer step per batch: the
        weights have not moved) for one forward instead of two.
        """
        behaviour = inputs["sampling_per_token_logps"]
        missing = ~torch.isfinite(behaviour)
        if bool(missing.any()):  # a token the engine could not score gets ratio 1, as in TRL
            behaviour = torch.where(missing, proximal, behaviour)
            inputs["sampling_per_token_logps"] = behaviour
            if not self.vllm_importance_sampling_correction:
                inputs["old_per_token_logps"] = behaviour
        if not self.vllm_importance_sampling_correction:
            return
        mask = inputs["completion_mask"] * inputs["tool_mask"]
        ratio, seq_level = self._importance_ratio(proximal, behaviour, mask)
        inputs["importance_sampling_ratio"] = ratio
        if self.loss_type != "vespo":  # VESPO reads the ratio itself
            # x ratio == TRL's per_token_loss * importance_sampling_ratio for every other loss
            advantages = inputs["advantages"]
            if advantages.dim() == 1:
                advantages = advantages.unsqueeze(1)
            inputs["advantages"] = advantages * ratio
        self._log_importance_metrics(proximal, behaviour, mask, ratio, seq_level)

    def _importance_ratio(
        self, proximal: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, bool]:
        """``pi_prox / pi_behaviour`` truncated or masked as TRL's vLLM IS correction does it,
        or (``trainer.off_policy = "m2po"``) under M2PO's second-moment mask."""
        if self.m2po_threshold is not None:
            from astraflow.trainer.m2po import m2po_ratio

            ratio, masked = m2po_ratio(proximal, behaviour, mask, self.m2po_threshold)
            self._metrics["train"]["sampling/m2po_masked_fraction"].append(masked)
            return ratio, False
        diff = torch.nan_to_num((proximal - behaviour) * mask, nan=0.0)
        mode = self.vllm_importance_sampling_mode
        seq_level = mode in ("sequence_mask", "sequence_truncate")
        ratio = torch.exp(diff.sum(dim=-1, keepdim=True) if seq_level else diff)
        lo = self.vllm_importance_sampling_clip_min
        hi = self.vllm_importance_sampling_clip_max
        if mode in ("token_truncate", "sequence_truncate"):
            ratio = torch.clamp(ratio, min=lo, max=hi)
        elif mode in ("token_mask", "sequence_mask"):
            lo_v = -math.inf if lo is None else lo
            hi_v = math.inf if hi is None else hi
            ratio = ratio.masked_fill((ratio < lo_v) | (ratio > hi_v), 0.0)
        else:
            raise ValueError(
                f"unknown vllm_importance_sampling_mode {mode!r}; expected token_truncate, "
                "token_mask, sequence_truncate or sequence_mask"
            )
        return ratio, seq_level

    def _log_importance_metrics(self, proximal, behaviour, mask, ratio, seq_level) -> None:
        m = self._metrics["train"]
        sel = mask.bool()
        delta = torch.abs(proximal - behaviour)[sel]
        zero = torch.tensor(0.0, device=proximal.device)
        m["sampling/sampling_logp_difference/mean"].append(
            float(self.accelerator.gather(delta.mean() if delta.numel() else zero).mean())
        )
        m["sampling/sampling_logp_difference/max"].append(
            float(self.accelerator.gather(delta.max() if delta.numel() else zero).max())
        )
        flat = ratio.flatten() if seq_level else ratio[sel]
        if flat.numel() == 0:
            flat = zero.unsqueeze(0) + 1.0
        m["sampling/importance_sampling_ratio/min"].append(
            float(self.accelerator.gather(flat.min()).min())
        )
        m["sampling/importance_sampling_ratio/mean"].append(
            float(self.accelerator.gather(flat.mean()).mean())
        )
        m["sampling/importance_sampling_ratio/max"].append(
            float(self.accelerator.gather(flat.max()).max())
        )

    # ------------------------------------------------------------------ step commit

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        super().log(logs, start_time)  # TRL merges its averaged metrics into ``logs`` first
        if self.model.training:
            self._last_logs = dict(logs)

    def _maybe_log_save_evaluate(self, *args: Any, **kwargs: Any) -> None:
        # Runs right after the optimizer step and on_step_end: logs (capturing metrics), saves a
        # checkpoint when due; then the step is committed: publish, ack, report.
        self._last_logs = {}
        super()._maybe_log_save_evaluate(*args, **kwargs)
        if self._pending is not None and self.state.global_step > self._committed_step:
            self._commit_step()

    def _commit_step(self) -> None:
        batch, collated, started = self._pending  # type: ignore[misc]
        self._pending = None
        version = self.version
        self._committed_step = version
        last = version >= self.state.max_steps
        published = False
        publish_started = time.perf_counter()
        if version % self.publish_every == 0 or last:
            published = self._publish(version)
        publish_s = time.perf_counter() - publish_started
        metrics = {
            k: float(v)
            for k, v in self._last_logs.items()
            if isinstance(v, (int, float)) and v is not None and math.isfinite(float(v))
        }
        metrics["wall_time_s"] = time.perf_counter() - started
        metrics["time/publish_s"] = publish_s
        for reason, count in collated.skipped.items():
            metrics[f"skipped/{reason}"] = float(count)
        if self.accelerator.is_main_process:
            self.source.ack(
                batch.id,
                version,
                metrics,
                checkpoint_version=self._checkpoint_version,
                invalid_samples=collated.invalid,
            )
            if self.on_step is not None:
                self.on_step(
                    StepReport(
                        version=version,
                        batch_id=batch.id,
                        published=published,
                        metrics=metrics,
                        skipped=dict(collated.skipped),
                        dropped_by_dataflow=dict(batch.dropped),
                    )
                )

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """Hugging Face's save, then the completion marker naming this step's batch (see
        :mod:`astraflow.trainer.checkpoints`); only then may the dataflow free earlier samples."""
        super()._save_checkpoint(model, trial)
        step = int(self.state.global_step)
        batch_id = None
        if self._pending is not None and step > self._committed_step:
            batch_id = self._pending[0].id
        if self.args.should_save:
            logs = {
                k: float(v)
                for k, v in self._last_logs.items()
                if isinstance(v, (int, float)) and math.isfinite(float(v))
            }
            folder = Path(self.args.output_dir) / f"checkpoint-{step}"
            write_mark(folder, CheckpointMark(step, batch_id, logs))
        self._checkpoint_version = step

    def state_dict_for_publication(self) -> dict[str, torch.Tensor]:
        """Full (unsharded) weights, as ``save_pretrained`` would write them. Collective call.

        With ``trainer.lora`` these are the base model's weights with the adapters merged in (keys
        of the base model), so every engine loads them like a full fine-tune's; see
        :func:`merged_lora_state`. An adapter policy (:attr:`adapter_only`) publishes its adapter
        alone, keyed as peft saves it (:func:`astraflow.models.lora.adapter_state`).

        Floating-point tensors are in the autocast dtype (:attr:`publish_dtype`): the float32
        master weights stay in the trainer, and nodes get what a bfloat16 engine holds; a weight
        delta between two versions is then one of bfloat16 values, mostly unchanged at an RL
        learning rate.
        """
        state = self.accelerator.get_state_dict(self.model)
        model = self.accelerator.unwrap_model(self.model)
        if self.adapter_only:
            from peft import get_peft_model_state_dict

            adapter = get_peft_model_state_dict(
                model, state_dict=state, adapter_name=TRAINER_ADAPTER, save_embedding_layers=False
            )
            return self._published_dtype(adapter)
        if _is_peft(model):
            return self._published_dtype(merged_lora_state(model, state))
        return self._published_dtype(state)

    @property
    def publish_dtype(self) -> torch.dtype | None:
        """The autocast dtype when ``bf16``/``fp16`` is on; None: publish the parameters' own."""
        if self.args.bf16:
            return torch.bfloat16
        if self.args.fp16:
            return torch.float16
        return None

    def _published_dtype(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        dtype = self.publish_dtype
        if dtype is None:
            return {k: v.detach() for k, v in state.items()}
        return {
            k: v.detach().to(dtype) if v.is_floating_point() else v.detach()
            for k, v in state.items()
        }

    def _publish(self, version: int) -> bool:
        if self.publish_fn is None or version in self._published:
            return False
        state = self.state_dict_for_publication()
        if self.accelerator.is_main_process:
            self.publish_fn(version, state)
        self._published.add(version)
        self.accelerator.wait_for_everyone()
        return True

    # ------------------------------------------------------------------ entry point

    def run(self, resume: bool | str = True) -> int:
        """Train until ``max_steps`` or until the source is exhausted; returns the final version.

        ``resume=True`` continues from the newest checkpoint in ``output_dir`` when there is one;
        a path resumes from that checkpoint; ``False`` starts fresh.
        """
        checkpoint: str | None = None
        if resume is True:
            found = newest_complete(self.args.output_dir)
            if found is not None:
                checkpoint = str(found[0])
                self._resume_from_mark(found[1])
        elif isinstance(resume, str):
            checkpoint = resume
        try:
            self.train(resume_from_checkpoint=checkpoint)
        except SourceExhausted:
            # The step in progress had not touched the weights; keep what the last step produced.
            if self.version > 0 and self.version % self.args.save_steps != 0:
                self._save_checkpoint(self.model, trial=None)
        return self.version

    def _resume_from_mark(self, mark: CheckpointMark) -> None:
        """The checkpoint's step may have been saved and killed before its acknowledgement: ack
        it now (a repeat is answered "already acknowledged"), so the dataflow's step count and
        this trainer's version agree before the first new step."""
        self._checkpoint_version = mark.version
        if mark.batch_id is not None and self.accelerator.is_main_process:
            self.source.ack(
                mark.batch_id, mark.version, dict(mark.metrics), checkpoint_version=mark.version
            )


def _is_peft(model: Any) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # peft not installed: no model can be a PeftModel
        return False
    return isinstance(model, PeftModel)


def merged_lora_state(
    model: Any, state: dict[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """The base model's state dict with every LoRA adapter merged: ``W + scale * B @ A``.

    Why not peft's ``merge_adapter()``/``unmerge_adapter()``: merging in place and back changes
    the trained base weights by float rounding every publication; this computes new tensors and
    leaves the model untouched. ``state`` is the peft model's full state dict (already gathered
    across processes by accelerate); by default the model's own. Keys lose peft's
    ``base_model.model.`` prefix and ``.base_layer``, and the adapter tensors are dropped.
    """
    from peft.tuners.lora import LoraLayer

    if state is None:
        state = model.state_dict()
    prefix = "base_model.model."
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if ".lora_" in key:
            continue
        name = key.removeprefix(prefix).replace(".base_layer.", ".")
        out[name] = value.detach()
    for name, module in model.get_base_model().named_modules():
        if not isinstance(module, LoraLayer):
            continue
        target = f"{name}.weight"
        merged = out[target].clone()
        for adapter in module.active_adapters:
            if adapter not in module.lora_A:
                continue
            a = state[f"{prefix}{name}.lora_A.{adapter}.weight"]
            b = state[f"{prefix}{name}.lora_B.{adapter}.weight"]
            delta = (b.float() @ a.float()) * module.scaling[adapter]
            if getattr(module, "fan_in_fan_out", False):
                delta = delta.T
            merged += delta.to(merged.dtype)
        out[target] = merged
    return out


def _resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"trainer.device={device!r} but CUDA is not available on this machine")
        # One process uses one device; a launcher picks it with CUDA_VISIBLE_DEVICES.
        return "cuda"
    raise ValueError(f"trainer.device={device!r}; expected auto, cpu, cuda or cuda:N")


def resolve_precision(cfg: TrainerConfig) -> tuple[str, torch.dtype]:
    """(device, parameter dtype) a trainer with ``cfg`` loads its model with: the parameter
    dtype is always float32 (master weights; the compute dtype is :func:`compute_dtype`)."""
    device = _resolve_device(cfg.device)
    return device, _resolve_dtype(cfg.dtype, device)[0]


def _resolve_dtype(dtype: str, device: str) -> tuple[torch.dtype, bool, bool]:
    """(parameter dtype, bf16 autocast, fp16 autocast).

    The parameters are float32 in every case: they are the master weights AdamW updates, and its
    state is float32 with them. Why not bfloat16 parameters: at an RL learning rate (1e-6) most
    AdamW updates are below half a bfloat16 ulp of the weight and round away; 20 such steps moved
    2 % of the weights against 30 % with float32 masters. bfloat16/float16 are compute dtypes,
    applied by accelerate's autocast (``GRPOConfig.bf16``/``fp16``); what nodes receive is cast
    to them at publication (:meth:`AstraGRPOTrainer.state_dict_for_publication`).
    """
    if device == "cpu":
        if dtype not in ("auto", "float32", "bfloat16"):
            raise ValueError(
                f"trainer.dtype={dtype!r} is not supported on CPU (no float16 autocast there); "
                "use float32, bfloat16 or auto"
            )
        return torch.float32, dtype == "bfloat16", False
    if dtype == "auto":
        dtype = "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    return torch.float32, dtype == "bfloat16", dtype == "float16"


def compute_dtype(cfg: TrainerConfig) -> torch.dtype:
    """The dtype a trainer with ``cfg`` computes in and publishes: bfloat16/float16 under
    autocast, else float32 (its parameters are float32 regardless, see :func:`_resolve_dtype`)."""
    device = _resolve_device(cfg.device)
    _, bf16, fp16 = _resolve_dtype(cfg.dtype, device)
    return torch.bfloat16 if bf16 else torch.float16 if fp16 else torch.float32


def make_grpo_config(
    cfg: TrainerConfig,
    *,
    output_dir: Path,
    max_steps: int,
    seed: int,
    device: str,
    bf16: bool,
    fp16: bool,
    temperature: float,
    max_completion_length: int,
) -> GRPOConfig:
    """The ``trl.GRPOConfig`` for a recipe's ``[policies.X.trainer]`` section.

    ``cfg.extra`` is applied last (any GRPOConfig field), except keys that would make TRL generate
    and TRL's gradient accumulation (see :data:`_ACCUMULATION_KEYS`).
    """
    for key in _ACCUMULATION_KEYS:
        if key in cfg.extra:
            raise ValueError(
                f"trainer.extra.{key} is not supported: the trainer splits each batch into "
                "micro-batches by a token budget and accumulates their gradients itself, one "
                f"optimizer step per batch; set trainer.micro_batch_tokens (now "
                f"{cfg.micro_batch_tokens}) to bound the memory of one forward+backward instead"
            )
    kwargs: dict[str, Any] = dict(
        output_dir=str(output_dir),
        loss_type=cfg.loss_type,
        importance_sampling_level=cfg.importance_sampling_level,
        learning_rate=cfg.learning_rate,
        beta=cfg.beta,
        epsilon=cfg.epsilon,
        epsilon_high=cfg.epsilon_high,
        scale_rewards=cfg.scale_rewards,
        max_grad_norm=cfg.max_grad_norm,
        weight_decay=cfg.weight_decay,
        warmup_steps=cfg.warmup_steps,
        lr_scheduler_type="constant_with_warmup",
        max_steps=max_steps,
        seed=seed,
        num_generations=2,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=1,
        temperature=temperature if temperature > 0 else 1.0,
        max_completion_length=max_completion_length,
        vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode="token_truncate",
        vllm_importance_sampling_clip_max=cfg.importance_sampling_cap,
        logging_steps=1,
        save_strategy="steps",
        save_steps=cfg.checkpoint_every,
        save_total_limit=3,
        report_to=[],
        disable_tqdm=True,
        use_cpu=device == "cpu",
        bf16=bf16,
        fp16=fp16,
        disable_dropout=True,
        shuffle_dataset=False,
        dataloader_num_workers=0,
        log_completions=False,
        # every parameter takes part in every forward (LoRA: frozen ones need no gradient), so
        # DDP need not traverse the graph for unused ones each step
        ddp_find_unused_parameters=False,
    )
    # The new name, set explicitly: TRL's config defaults the deprecated alias to True.
    kwargs["activation_checkpointing"] = cfg.gradient_checkpointing
    kwargs.update(cfg.extra)
    for key, required in _FORBIDDEN_EXTRA.items():
        if kwargs.get(key, required) != required:
            raise ValueError(
                f"trainer.extra.{key}={kwargs[key]!r} is not supported: AstraFlow trainers never "
                f"generate and take one optimizer step per pulled batch (expected {required!r})"
            )
    return GRPOConfig(**kwargs)


def build_trainer(
    model_path: str,
    trainer_cfg: TrainerConfig,
    source: BatchSource,
    run_dir: str | Path,
    policy: str,
    *,
    max_steps: int,
    seed: int = 0,
    publish: PublishFn | None = None,
    on_step: Callable[[StepReport], None] | None = None,
    publish_on_start: bool = True,
    temperature: float = 1.0,
    max_completion_length: int = 512,
    max_staleness: int | None = None,
    torch_threads: int = 1,
    adapter: AdapterSpec | None = None,
    base_model: Any = None,
) -> AstraGRPOTrainer:
    """An :class:`AstraGRPOTrainer` for ``policy``, ready for ``.run()``.

    ``adapter``: the policy is that LoRA adapter of the model at ``model_path`` (its base); it
    starts from :func:`~astraflow.models.lora.init_adapter_`'s weights, the same a node's engine
    starts from, and publishes the adapter alone. ``base_model``: the model object to train on
    instead of loading ``model_path`` (a trainer of several adapters hands each a copy of one
    base whose tensors they share, :class:`~astraflow.trainer.adapters.SharedBase`).

    ``model_path``: ``builtin:NAME``, a local directory or a hub id (resolved with
    :func:`astraflow.models.resolve_model`). Checkpoints (HF format + optimizer/scheduler/trainer
    state for resume) go to ``run_dir/checkpoints/<policy>/checkpoint-<step>``. ``temperature``
    must be the sampling temperature of the rollout engine, since the behaviour log-probs were taken
    at it. ``max_staleness`` (versions) is a last guard: older samples are kept out of the loss and
    counted under ``skipped/stale`` in the ack metrics (the dataflow normally drops them first).
    """
    from transformers import AutoModelForCausalLM

    from astraflow.models import load_tokenizer, resolve_model

    torch.set_num_threads(torch_threads)
    device = _resolve_device(trainer_cfg.device)
    param_dtype, bf16, fp16 = _resolve_dtype(trainer_cfg.dtype, device)
    path = resolve_model(model_path)
    tokenizer = load_tokenizer(path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if base_model is not None:
        model = base_model
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=param_dtype)
    args = make_grpo_config(
        trainer_cfg,
        output_dir=Path(run_dir) / "checkpoints" / policy,
        max_steps=max_steps,
        seed=seed,
        device=device,
        bf16=bf16,
        fp16=fp16,
        temperature=temperature,
        max_completion_length=max_completion_length,
    )
    trainer = AstraGRPOTrainer(
        model=model,
        args=args,
        processing_class=tokenizer,
        source=source,
        policy=policy,
        groups_per_step=trainer_cfg.groups_per_step,
        publish=publish,
        on_step=on_step,
        publish_every=trainer_cfg.publish_every,
        publish_on_start=publish_on_start,
        max_staleness=max_staleness,
        peft_config=_peft_config(trainer_cfg, adapter),
    )
    trainer.micro_batch_tokens = trainer_cfg.micro_batch_tokens
    if trainer_cfg.off_policy == "m2po":
        trainer.m2po_threshold = trainer_cfg.m2po_threshold
    trainer.turn_discount = trainer_cfg.turn_discount
    if adapter is not None:
        from astraflow.models.lora import adapter_state, init_adapter_

        trainer.adapter_only = True
        init_adapter_(adapter_state(trainer.model, TRAINER_ADAPTER), adapter.seed)
    return trainer


def _peft_config(trainer_cfg: TrainerConfig, adapter: AdapterSpec | None) -> Any:
    """peft's config of the policy's LoRA: an adapter policy's own, or ``trainer.lora``."""
    if adapter is not None:
        return peft_lora_config(adapter.lora)
    if trainer_cfg.lora is not None:
        return peft_lora_config(trainer_cfg.lora)
    return None
