"""The decode state of a continuously batched group of sequences on one Hugging Face causal LM.

Why our own loop instead of ``model.generate``: episodes arrive and finish at different times. Here
new sequences are prefilled on their own and then *joined* to the running batch at a step boundary
(their KV cache and attention mask are left-padded to a common length and concatenated on the batch
axis), and finished sequences leave at once (rows are index-selected away and all-padding columns
trimmed). So many episodes share every forward pass without waiting for the slowest of a batch.

Conventions: ``mask`` covers exactly the positions held in the KV cache (1 = real token, 0 = left
padding); ``next_input`` is the token each row feeds at the next step and ``next_pos`` its position
id (number of real tokens before it), so rotary positions match an unpadded run of the same text.

LoRA adapters: on a ``peft`` model serving several adapters of one base, each row names its
adapter (``SequenceRow.adapter``) and every forward passes the rows' names as peft's
``adapter_names``, so rows of different adapters share each forward pass of the base (peft's
mixed-adapter batch: the base matmuls run once for all rows, each adapter's low-rank product on
its own rows).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from astraflow.rollout.engines.sampling import RowSampling


@dataclass
class SequenceRow:
    """One sequence being generated (a request with ``n`` > 1 owns ``n`` rows)."""

    owner: Any  # the request object; opaque here
    index: int  # which of the owner's ``n`` completions
    prompt_len: int
    max_tokens: int
    stop_token_ids: frozenset[int]
    stop_strings: tuple[str, ...]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    matched_stop: str | int | None = None
    #: peft adapter this row runs with (``"__base__"``: the bare base); None on a plain model
    adapter: str | None = None


class CausalLMRunner:
    """Thin adapter over the model's forward that hides the cache keyword's name across versions."""

    def __init__(self, model: torch.nn.Module):
        from transformers import DynamicCache

        self.model = model
        self._cache_cls = DynamicCache
        # a peft model forwards **kwargs to the model it wraps: read that model's signature
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        params = inspect.signature(base.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._supports_logits_to_keep = "logits_to_keep" in params
        #: the model serves LoRA adapters: every forward names each row's adapter
        self.adapters = base is not model

    def new_cache(self):
        return self._cache_cls(config=self.model.config)

    def forward(
        self, input_ids, attention_mask, position_ids, cache, adapter_names=None
    ) -> torch.Tensor:
        """Run the model; return the logits of the last position of every row ([B, V])."""
        kwargs = {self._cache_kw: cache, "use_cache": True}
        if self._supports_logits_to_keep:
            kwargs["logits_to_keep"] = 1
        if self.adapters:
            kwargs["adapter_names"] = adapter_names
        out = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs
        )
        return out.logits[:, -1, :]


class DecodeState:
    """Running rows with their KV cache; supports join (``merge``), step and leave (``keep``)."""

    def __init__(
        self,
        rows: list[SequenceRow],
        cache: Any,
        mask: torch.Tensor,
        next_input: torch.Tensor,
        next_pos: torch.Tensor,
        sampling: RowSampling,
        stop_matrix: torch.Tensor,
        tokens_left: torch.Tensor,
    ):
        self.rows = rows
        self.cache = cache
        self.mask = mask
        self.next_input = next_input
        self.next_pos = next_pos
        self.sampling = sampling
        self.stop_matrix = stop_matrix  # [B, K] stop token ids per row, -1 padded
        self.tokens_left = tokens_left  # [B] tokens each row may still generate

    def __len__(self) -> int:
        return len(self.rows)

    # -- building ---------------------------------------------------------------------------
    @staticmethod
    def prefill(
        runner: CausalLMRunner,
        prompts: list[list[int]],
        rows: list[SequenceRow],
        sampling: RowSampling,
        pad_id: int,
        device: torch.device,
    ) -> tuple[DecodeState, torch.Tensor]:
        """Run the prompts (left-padded) through the model; return the state and last logits.

        Each distinct prompt runs once: a GRPO group sends the same prompt ``group_size`` times,
        and identical prompts have identical KV caches and logits, so their rows are copied
        from one forward pass (a copy per row, because rows diverge from the first sampled token).
        A prompt is distinct per adapter: the same tokens under two adapters are two caches.
        """
        first_row: dict[tuple[str | None, tuple[int, ...]], int] = {}
        source = [
            first_row.setdefault((row.adapter, tuple(p)), len(first_row))
            for p, row in zip(prompts, rows, strict=True)
        ]
        distinct = [list(p) for _, p in first_row]
        adapter_names = [a for a, _ in first_row] if runner.adapters else None
        width = max(len(p) for p in distinct)
        ids = torch.full((len(distinct), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(distinct), width), dtype=torch.long)
        for i, prompt in enumerate(distinct):
            ids[i, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask[i, width - len(prompt) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        position_ids = (mask.cumsum(-1) - 1).clamp_(min=0)
        cache = runner.new_cache()
        logits = runner.forward(ids, mask, position_ids, cache, adapter_names)
        if len(distinct) < len(prompts):
            index = torch.tensor(source, dtype=torch.long, device=device)
            logits = logits.index_select(0, index)
            mask = mask.index_select(0, index)
            for layer in cache.layers:
                layer.keys = layer.keys.index_select(0, index)
                layer.values = layer.values.index_select(0, index)
        lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=device)
        stop_width = max(1, max(len(r.stop_token_ids) for r in rows))
        stop_matrix = torch.full((len(rows), stop_width), -1, dtype=torch.long)
        for i, row in enumerate(rows):
            if row.stop_token_ids:
                ids_i = sorted(row.stop_token_ids)
                stop_matrix[i, : len(ids_i)] = torch.tensor(ids_i, dtype=torch.long)
        tokens_left = torch.tensor([r.max_tokens for r in rows], dtype=torch.long, device=device)
        state = DecodeState(
            rows,
            cache,
            mask,
            next_input=torch.zeros(len(rows), dtype=torch.long, device=device),
            next_pos=lengths,
            sampling=sampling,
            stop_matrix=stop_matrix.to(device),
            tokens_left=tokens_left,
        )
        return state, logits

    # -- stepping ---------------------------------------------------------------------------
    def step(self, runner: CausalLMRunner) -> torch.Tensor:
        """Feed ``next_input`` to the model; return the next-token logits ([B, V])."""
        ones = torch.ones((len(self.rows), 1), dtype=self.mask.dtype, device=self.mask.device)
        mask = torch.cat([self.mask, ones], dim=1)
        adapter_names = [row.adapter for row in self.rows] if runner.adapters else None
        logits = runner.forward(
            self.next_input[:, None], mask, self.next_pos[:, None], self.cache, adapter_names
        )
        self.mask = mask
        self.next_pos = self.next_pos + 1
        return logits

    def record(self, tokens: torch.Tensor, logprobs: torch.Tensor) -> list[bool]:
        """Accept the sampled tokens; return, per row, whether it hit a stop id or its limit."""
        self.next_input = tokens
        self.tokens_left = self.tokens_left - 1
        hit_stop = (tokens[:, None] == self.stop_matrix).any(dim=1)
        out_of_budget = self.tokens_left <= 0
        # One device->host transfer per step for ids and flags, one for the log-probs.
        token_list, stop_list, budget_list = torch.stack(
            [tokens, hit_stop.long(), out_of_budget.long()]
        ).tolist()
        logprob_list = logprobs.tolist()
        for row, tok, lp, stopped, exhausted in zip(
            self.rows, token_list, logprob_list, stop_list, budget_list, strict=True
        ):
            row.token_ids.append(tok)
            row.logprobs.append(lp)
            if stopped:
                row.finish_reason, row.matched_stop = "stop", tok
            elif exhausted:
                row.finish_reason = "length"
        return [bool(a or b) for a, b in zip(stop_list, budget_list, strict=True)]

    # -- membership -------------------------------------------------------------------------
    def keep(self, keep_rows: list[int]) -> None:
        """Drop every row not listed (finished or cancelled) and trim all-padding columns."""
        if len(keep_rows) == len(self.rows):
            return
        index = torch.tensor(keep_rows, dtype=torch.long, device=self.mask.device)
        self.rows = [self.rows[i] for i in keep_rows]
        self.mask = self.mask.index_select(0, index)
        self.next_input = self.next_input.index_select(0, index)
        self.next_pos = self.next_pos.index_select(0, index)
        self.stop_matrix = self.stop_matrix.index_select(0, index)
        self.tokens_left = self.tokens_left.index_select(0, index)
        self.sampling = self.sampling.select(index, keep_rows)
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, index)
            layer.values = layer.values.index_select(0, index)
        if not self.rows:
            return
        used = self.mask.any(dim=0)
        first = int(used.int().argmax())
        if first > 0:
            self.mask = self.mask[:, first:]
            for layer in self.cache.layers:
                layer.keys = layer.keys[:, :, first:, :]
                layer.values = layer.values[:, :, first:, :]

    def merge(self, other: DecodeState) -> None:
        """Append ``other``'s rows: left-pad the shorter cache/mask so both share one length."""
        width = max(self.mask.shape[1], other.mask.shape[1])
        self.mask = torch.cat([_left_pad(self.mask, width), _left_pad(other.mask, width)], dim=0)
        for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            mine.keys = torch.cat([_left_pad(mine.keys, width), _left_pad(theirs.keys, width)])
            mine.values = torch.cat(
                [_left_pad(mine.values, width), _left_pad(theirs.values, width)]
            )
        self.rows = self.rows + other.rows
        self.next_input = torch.cat([self.next_input, other.next_input])
        self.next_pos = torch.cat([self.next_pos, other.next_pos])
        stop_width = max(self.stop_matrix.shape[1], other.stop_matrix.shape[1])
        self.stop_matrix = torch.cat(
            [
                _right_pad_ids(self.stop_matrix, stop_width),
                _right_pad_ids(other.stop_matrix, stop_width),
            ]
        )
        self.tokens_left = torch.cat([self.tokens_left, other.tokens_left])
        self.sampling = RowSampling.concat([self.sampling, other.sampling])


def _left_pad(t: torch.Tensor, width: int) -> torch.Tensor:
    """Pad the sequence axis (dim 1 of a mask, dim 2 of a [B, H, L, D] cache) on the left."""
    seq_dim = 1 if t.dim() == 2 else 2
    missing = width - t.shape[seq_dim]
    if missing == 0:
        return t
    if t.dim() == 2:
        return F.pad(t, (missing, 0))
    return F.pad(t, (0, 0, missing, 0))


def _right_pad_ids(t: torch.Tensor, width: int) -> torch.Tensor:
    missing = width - t.shape[1]
    return t if missing == 0 else F.pad(t, (0, missing), value=-1)
