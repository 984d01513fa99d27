"""Batched next-token sampling with per-row temperature, top-p and seed.

Why one function for the whole batch: concurrent episodes with different sampling settings share a
decode step, so temperature and top-p are per-row tensors and the step costs a handful of tensor
ops whatever the mix. The returned log-prob is ``log_softmax(logits / T)`` at the chosen token over
the *full* vocabulary (top-p only restricts which tokens may be drawn): that is exactly what the
trainer recomputes from a forward pass, so the behaviour log-probs and the trainer's agree. For
``T == 0`` the token is the argmax and the log-prob is ``log_softmax(logits)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RowSampling:
    """Per-row sampling settings of a decode batch, kept as tensors on the model's device.

    The ``*_flags`` are plain Python facts about the rows, kept beside the tensors so the per-step
    sampler can skip work (top-p sort, greedy merge, seeded draws) without a device sync.
    """

    temperature: torch.Tensor  # [B] float; 0 means greedy
    top_p: torch.Tensor  # [B] float in (0, 1]
    generators: list[torch.Generator | None]  # per row; None = the engine's shared generator
    greedy_flags: list[bool]
    top_p_flags: list[bool]

    @staticmethod
    def build(
        temperature: list[float],
        top_p: list[float],
        generators: list[torch.Generator | None],
        device: torch.device,
    ) -> RowSampling:
        return RowSampling(
            torch.tensor(temperature, dtype=torch.float32, device=device),
            torch.tensor(top_p, dtype=torch.float32, device=device),
            generators,
            [t == 0 for t in temperature],
            [p < 1 for p in top_p],
        )

    @property
    def batch_size(self) -> int:
        return int(self.temperature.shape[0])

    def select(self, index: torch.Tensor, index_list: list[int]) -> RowSampling:
        return RowSampling(
            self.temperature.index_select(0, index),
            self.top_p.index_select(0, index),
            [self.generators[i] for i in index_list],
            [self.greedy_flags[i] for i in index_list],
            [self.top_p_flags[i] for i in index_list],
        )

    @staticmethod
    def concat(parts: list[RowSampling]) -> RowSampling:
        return RowSampling(
            torch.cat([p.temperature for p in parts]),
            torch.cat([p.top_p for p in parts]),
            [g for p in parts for g in p.generators],
            [f for p in parts for f in p.greedy_flags],
            [f for p in parts for f in p.top_p_flags],
        )


def sample_next(
    logits: torch.Tensor, rows: RowSampling, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row of ``logits`` ([B, V]); return (token ids [B], log-probs [B])."""
    logits = logits.float()
    any_greedy = any(rows.greedy_flags)
    if all(rows.greedy_flags):
        tokens = logits.argmax(dim=-1)
        logprobs = torch.log_softmax(logits, dim=-1)
        return tokens, logprobs.gather(1, tokens[:, None]).squeeze(1)

    temperature = rows.temperature
    if any_greedy:
        temperature = torch.where(temperature == 0, torch.ones_like(temperature), temperature)
    logprobs = torch.log_softmax(logits / temperature[:, None], dim=-1)
    probs = logprobs.exp()
    if any(rows.top_p_flags):
        probs = _top_p_filter(probs, rows.top_p)
    if all(g is None for g in rows.generators):
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(1)
    else:
        tokens = torch.empty(probs.shape[0], dtype=torch.long, device=probs.device)
        for i, row_gen in enumerate(rows.generators):
            tokens[i] = torch.multinomial(probs[i], 1, generator=row_gen or generator)[0]
    if any_greedy:
        tokens = torch.where(rows.temperature == 0, logits.argmax(dim=-1), tokens)
    return tokens, logprobs.gather(1, tokens[:, None]).squeeze(1)


def _top_p_filter(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Zero the tail of each row outside its nucleus (the smallest set with mass >= top_p)."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop_sorted = mass_before >= top_p[:, None]
    drop_sorted[:, 0] = False  # always keep the most likely token
    drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)
    return probs.masked_fill(drop, 0.0)
