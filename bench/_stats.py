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
    reached the target.

    Censoring is counted both ways, so no seed leaves the table unseen: ``reached`` counts the
    seeds where both got there (the ones with a ratio), ``only_system`` those where just the
    system did (a win the ratio cannot state), ``only_baseline`` those where just the baseline did
    (a loss the ratio cannot state), ``neither`` the rest; ``seeds`` is all of them."""
    logs: list[float] = []
    only_system = only_baseline = neither = 0
    for b, s in zip(baseline, system, strict=True):
        b_ok = b is not None and b > 0
        s_ok = s is not None and s > 0
        if b_ok and s_ok:
            logs.append(math.log(b / s))
        elif s_ok:
            only_system += 1
        elif b_ok:
            only_baseline += 1
        else:
            neither += 1
    p = paired(logs)
    return {
        "geo_mean": math.exp(p["mean"]) if p["mean"] is not None else None,
        "ci95": [math.exp(x) for x in p["ci95"]] if p["ci95"] else None,
        "reached": p["n"],
        "only_system": only_system,
        "only_baseline": only_baseline,
        "neither": neither,
        "seeds": p["n"] + only_system + only_baseline + neither,
    }


# ----------------------------------------------------------------------------- sustained targets
#
# Curves are sequences of ``(t, accuracy)`` pairs (seconds since training start, held-out
# accuracy), one per evaluation, in time order: what ``_records.EvalPoint`` holds, or any object
# with ``t`` and ``accuracy`` attributes.


def _curve(points: Iterable[Any]) -> list[tuple[float, float]]:
    out = []
    for p in points:
        t, acc = (p.t, p.accuracy) if hasattr(p, "accuracy") else (p[0], p[1])
        if t is not None and acc is not None:
            out.append((float(t), float(acc)))
    return sorted(out)


def time_to_sustained(points: Iterable[Any], target: float, window: int = 2) -> float | None:
    """Seconds until the held-out accuracy is *sustained* at ``target``: the first run of
    ``window`` consecutive evaluations whose mean is at or above it, placed at the time of the
    last evaluation of that run (when the criterion is known). None if it never is.

    A first crossing of a noisy curve rewards a lucky evaluation, and whichever system evaluates
    more often per second gets more draws; the mean of two consecutive evaluations halves the
    variance of one and needs the level to hold. ``window = 1`` is the first crossing."""
    curve = _curve(points)
    if window < 1:
        raise ValueError("window must be at least 1")
    for i in range(window - 1, len(curve)):
        run = curve[i - window + 1 : i + 1]
        if statistics.fmean(a for _, a in run) >= target - 1e-12:
            return curve[i][0]
    return None


def accuracy_at(points: Iterable[Any], budget_s: float) -> float | None:
    """Held-out accuracy at a wall-clock budget: the last evaluation at or before ``budget_s``
    seconds (a run that finished earlier keeps its final accuracy). None before the first."""
    best = None
    for t, acc in _curve(points):
        if t <= budget_s + 1e-9:
            best = acc
    return best


def target_ladder(
    curves: dict[str, Sequence[Sequence[Any]]],
    levels: dict[str, float],
    pairs: Sequence[tuple[str, str]],
    window: int = 2,
) -> dict[str, Any]:
    """The race to every level of a ladder, sustained (``window`` evaluations), per system and
    for each ``(baseline, system)`` pair.

    ``curves[system]`` holds one curve per seed, seeds paired by index across systems;
    ``levels`` names each level (e.g. ``"start+0.03"``, ``"trl median final"``). Per level:
    each system's censored median time and how many seeds reached it, and per pair the paired
    speed-up with censoring counted both ways (:func:`paired_speedup`)."""
    out: dict[str, Any] = {}
    for name, level in sorted(levels.items(), key=lambda kv: (kv[1], kv[0])):
        times = {s: [time_to_sustained(c, level, window) for c in cs] for s, cs in curves.items()}
        row: dict[str, Any] = {
            "level": level,
            "systems": {
                s: {
                    "time_s": censored_spread(ts).median,
                    "reached": sum(t is not None for t in ts),
                    "seeds": len(ts),
                }
                for s, ts in times.items()
            },
        }
        for base, system in pairs:
            if base in times and system in times:
                n = min(len(times[base]), len(times[system]))
                row[f"{system}_vs_{base}"] = paired_speedup(times[base][:n], times[system][:n])
        out[name] = row
    return out


def acc_at_equal_wallclock(
    curves: dict[str, Sequence[Sequence[Any]]],
    budgets: dict[str, float],
    pairs: Sequence[tuple[str, str]],
) -> dict[str, Any]:
    """Held-out accuracy of every system at each wall-clock budget (:func:`accuracy_at`), median
    over seeds, and per ``(baseline, system)`` pair the paired difference system - baseline."""
    out: dict[str, Any] = {}
    for name, budget in budgets.items():
        accs = {s: [accuracy_at(c, budget) for c in cs] for s, cs in curves.items()}
        row: dict[str, Any] = {
            "budget_s": budget,
            "systems": {s: spread_json(spread(a)) for s, a in accs.items()},
            # seeds whose run had ended by the budget (their accuracy is their final one)
            "finished_by_budget": {
                s: sum(1 for c in cs if _curve(c) and _curve(c)[-1][0] <= budget + 1e-9)
                for s, cs in curves.items()
            },
        }
        for base, system in pairs:
            if base in accs and system in accs:
                row[f"{system}_minus_{base}"] = paired(
                    None if a is None or b is None else a - b
                    for a, b in zip(accs[system], accs[base], strict=False)
                )
        out[name] = row
    return out


def non_inferiority(diffs: Iterable[float | None], margin: float) -> dict[str, Any]:
    """Paired differences system - baseline (e.g. final accuracy at equal trained samples) judged
    against a non-inferiority ``margin`` declared before the run: ``non-inferior`` when the 95 %
    interval lies above ``-margin``, ``inferior`` when it lies wholly below it, ``inconclusive``
    otherwise (or with fewer than two pairs: no interval)."""
    p = paired(diffs)
    ci = p["ci95"]
    if ci is None:
        verdict = "inconclusive"
    elif ci[0] > -margin:
        verdict = "non-inferior"
    elif ci[1] < -margin:
        verdict = "inferior"
    else:
        verdict = "inconclusive"
    return {**p, "margin": margin, "verdict": verdict}
