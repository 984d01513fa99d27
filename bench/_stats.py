"""Medians, spreads and thresholds over several seeds' figures (pure functions)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Spread:
    median: float | None
    lo: float | None
    hi: float | None
    n: int

    def text(self, fmt: str = "{:.2f}", unit: str = "") -> str:
        """``median [lo–hi]``; "-" without a median, "never" for a censored upper end."""
        if self.median is None:
            return "-"
        if self.n <= 1 or self.lo == self.hi:
            return fmt.format(self.median) + unit
        lo = "-" if self.lo is None else fmt.format(self.lo)
        hi = "never" if self.hi is None else fmt.format(self.hi)
        return f"{fmt.format(self.median)}{unit} [{lo}–{hi}]"


def spread(values: Iterable[float | None]) -> Spread:
    """Median and range of the values that exist (None and NaN are left out)."""
    vals = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not vals:
        return Spread(None, None, None, 0)
    return Spread(statistics.median(vals), min(vals), max(vals), len(vals))


def censored_spread(values: Sequence[float | None]) -> Spread:
    """Spread of times where None means "never reached": it ranks above every finite time.

    So a system that reaches the threshold in only one of three seeds gets no median (None)
    instead of the median of its one lucky run.
    """
    if not values:
        return Spread(None, None, None, 0)
    ranked = sorted(math.inf if v is None else float(v) for v in values)
    n = len(ranked)
    mid = ranked[n // 2] if n % 2 else (ranked[n // 2 - 1] + ranked[n // 2]) / 2
    finite = [v for v in ranked if v != math.inf]

    def clean(v: float) -> float | None:
        return None if v == math.inf or math.isnan(v) else v

    return Spread(clean(mid), finite[0] if finite else None, clean(ranked[-1]), n)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def choose_threshold(
    final_accuracies: dict[str, Sequence[float | None]], accuracy_before: float | None
) -> float | None:
    """The accuracy every system is timed to: the lowest median final accuracy among systems.

    Every system reaches it in a typical (median) run, so time-to-accuracy compares systems on a
    level they all attain. None when some system has no final accuracy or the level is no better
    than the starting policy (then there is no learning to time).
    """
    medians = []
    for values in final_accuracies.values():
        s = spread(values)
        if s.median is None:
            return None
        medians.append(s.median)
    if not medians:
        return None
    level = min(medians)
    if accuracy_before is not None and level <= accuracy_before + 1e-9:
        return None
    return level


def accuracy_levels(start: float | None, stop: float | None) -> list[float]:
    """The accuracy ladder: every 0.01 from just above ``start`` (the accuracy before training)
    up to ``stop``. A headline threshold near the plateau is decided by one noisy evaluation; the
    ladder shows the same race at every level on the way."""
    levels: list[float] = []
    if start is None or stop is None:
        return levels
    level = math.floor(start * 100 + 1) / 100
    while level <= stop + 1e-9:
        levels.append(level)
        level = round(level + 0.01, 2)
    return levels


def spread_json(s: Spread) -> dict[str, Any]:
    return {"median": s.median, "min": s.lo, "max": s.hi, "n": s.n}


#: Two-sided 95 % quantiles of Student's t by degrees of freedom (1-30); 1.96 beyond.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042)  # fmt: skip


def paired(values: Iterable[float | None]) -> dict[str, Any]:
    """Mean, standard deviation and 95 % t-interval of per-seed paired values (differences, or
    log speed-ups); None where fewer than two pairs exist (no interval from one seed)."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(vals)
    if not n:
        return {"mean": None, "sd": None, "ci95": None, "n": 0}
    mean = statistics.fmean(vals)
    if n < 2:
        return {"mean": mean, "sd": None, "ci95": None, "n": 1}
    sd = statistics.stdev(vals)
    half = (_T95[n - 2] if n - 1 <= len(_T95) else 1.96) * sd / math.sqrt(n)
    return {"mean": mean, "sd": sd, "ci95": [mean - half, mean + half], "n": n}


def paired_speedup(baseline: Sequence[float | None], system: Sequence[float | None]) -> dict:
    """Per-seed speed-ups ``baseline / system`` of times to a target (seeds paired by index),
    summarised on the log scale: geometric mean and its 95 % interval over the seeds where both
    reached the target; ``reached`` counts those, ``only_system`` the seeds where just the system
    did (a speed-up the ratio cannot state: the baseline never got there)."""
    logs, only_system = [], 0
    for b, s in zip(baseline, system, strict=True):
        if s is not None and s > 0 and b is not None and b > 0:
            logs.append(math.log(b / s))
        elif s is not None and b is None:
            only_system += 1
    p = paired(logs)
    return {
        "geo_mean": math.exp(p["mean"]) if p["mean"] is not None else None,
        "ci95": [math.exp(x) for x in p["ci95"]] if p["ci95"] else None,
        "reached": p["n"],
        "only_system": only_system,
    }
