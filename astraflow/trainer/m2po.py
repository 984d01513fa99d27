"""M2PO's second-moment trust region for stale samples (Zheng et al. 2025, "Prosperity before
Collapse: How Far Can Off-Policy RL Reach with Stale Data on LLMs?").

Why: with stale data the per-token importance ratio ``r = pi_theta / pi_behaviour`` has a heavy
tail. Truncating it at a cap (the default correction) biases every large-ratio token; PPO's clip
zeroes their gradient outright. M2PO instead masks only the few tokens with the most extreme
log-ratios, just enough that the second moment ``M2 = mean((log r)^2)`` of the tokens kept is at
most ``threshold``, and uses the untruncated ratio on the rest. With fresh data nothing is masked.
"""

from __future__ import annotations

import torch


def m2po_keep(log_ratio: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
    """A 0/1 tensor like ``mask``: the tokens kept, after masking the largest ``(log r)^2`` until
    the mean over the rest is <= ``threshold`` (ties broken by position, deterministically)."""
    sel = mask.bool()
    values = (log_ratio.detach().double() ** 2)[sel]
    keep = mask.clone()
    n = values.numel()
    if n == 0 or float(values.mean()) <= threshold:
        return keep
    order = torch.argsort(values, descending=True, stable=True)
    sorted_values = values[order]
    removed = torch.cumsum(sorted_values, 0)
    left = torch.arange(n - 1, -1, -1, device=values.device, dtype=values.dtype)  # n-1 .. 0
    mean_left = (values.sum() - removed) / left.clamp(min=1)
    ok = (mean_left <= threshold) | (left == 0)
    m = int(torch.nonzero(ok)[0]) + 1  # tokens to mask
    flat_keep = torch.ones(n, dtype=keep.dtype, device=keep.device)
    flat_keep[order[:m]] = 0
    keep[sel] = flat_keep
    return keep


def m2po_ratio(
    proximal: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, threshold: float
) -> tuple[torch.Tensor, float]:
    """Per-token ``pi_prox / pi_behaviour`` with the M2PO mask applied (masked tokens get 0), and
    the fraction of loss tokens masked."""
    log_ratio = torch.nan_to_num((proximal - behaviour) * mask, nan=0.0)
    keep = m2po_keep(log_ratio, mask, threshold)
    total = float(mask.sum())
    masked = (total - float(keep.sum())) / total if total else 0.0
    return torch.exp(log_ratio) * keep, masked
