"""Every figure a run logs, as series by step, grouped the way a person reads them.

Why a catalogue built from the records rather than a fixed list: the trainer logs what TRL and
the loss in use produce (``clip_ratio/*`` only with clipping, ``kl`` only with ``beta > 0``,
``sampling/*`` only with the off-policy correction), the dataflow adds its own, and a fixed list
silently leaves out whatever it did not foresee. Every numeric field of a ``step`` record (top
level, ``metrics``, ``version_lag``, the nodes' figures summed or averaged over nodes) becomes a
series; :func:`group_of` puts it under learning, data or system by its name.

Evaluations are series too, one per task set and split; an evaluation whose every task errored
measured nothing, so it is left out of the accuracy series and listed under ``errored`` instead
of charting as accuracy 0.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

#: the groups in the order the dashboard shows them
GROUPS = ("learning", "data", "system")

#: name prefixes (after the ``metrics/`` of trainer figures is dropped) -> group; first match wins
_PREFIXES: tuple[tuple[str, str], ...] = (
    ("reward", "learning"),
    ("loss", "learning"),
    ("grad_norm", "learning"),
    ("entropy", "learning"),
    ("kl", "learning"),
    ("clip_ratio", "learning"),
    ("learning_rate", "learning"),
    ("sampling/", "learning"),
    ("m2po", "learning"),
    ("accuracy", "learning"),
    ("time/", "system"),
    ("wall_time", "system"),
    ("step_time", "system"),
    ("batch_wait", "system"),
    ("nodes/weight", "system"),
    ("admission/", "system"),
    ("epoch", "system"),
)

#: node figures that add up over nodes (rates, counts); the others are averaged
_NODE_SUMS = {"episodes", "errors", "env_timeouts", "pushes", "episodes_per_s", "tokens_per_s"}

#: what a chart is called, where its key alone would not say it
TITLES = {
    "reward_mean": "mean reward (train groups)",
    "samples_per_s": "trained samples / s",
    "staleness_mean": "mean staleness (versions)",
    "dropped_total": "dropped samples (run total, all reasons)",
}


def group_of(key: str) -> str:
    """The group of a series key (``learning``, ``data`` or ``system``); data by default."""
    for prefix, group in _PREFIXES:
        if key.startswith(prefix):
            return group
    return "data"


@dataclass
class Series:
    """One figure of every policy, by trainer step."""

    key: str
    group: str
    title: str
    policies: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    def add(self, policy: str, step: float, value: float) -> None:
        xy = self.policies.setdefault(policy, {"x": [], "y": []})
        xy["x"].append(step)
        xy["y"].append(value)


@dataclass
class RunSeries:
    """What the dashboard charts: series by group, and the evaluations that measured nothing."""

    groups: dict[str, list[Series]]
    #: per policy: evaluations in which every task errored (step, task set, errors)
    errored_evals: dict[str, list[dict[str, Any]]]

    def as_json(self) -> dict[str, Any]:
        return {
            "groups": {
                g: [
                    {"key": s.key, "title": s.title, "policies": s.policies}
                    for s in self.groups.get(g, [])
                ]
                for g in GROUPS
            },
            "errored_evals": self.errored_evals,
        }


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def errored_eval(record: dict) -> bool:
    """An ``eval`` record in which every task errored: it measured nothing (not accuracy 0)."""
    if record.get("type") != "eval":
        return False
    n, errors = _number(record.get("n")), _number(record.get("errors")) or 0.0
    return n is not None and n > 0 and errors >= n


def _step_figures(record: dict) -> Iterable[tuple[str, float]]:
    """Every numeric figure of one ``step`` record, with its series key."""
    for key, value in record.items():
        if key in ("step", "version", "seq", "time"):
            continue
        if (v := _number(value)) is not None:
            yield key, v
    for key, value in (record.get("version_lag") or {}).items():
        if (v := _number(value)) is not None:
            yield f"version_lag/{key}", v
    for key, value in (record.get("admission") or {}).items():
        if (v := _number(value)) is not None:
            yield f"admission/{key}", v
    drops = record.get("drops_total")
    if isinstance(drops, dict):
        counts = {
            str(k): v for k, v in ((k, _number(v)) for k, v in drops.items()) if v is not None
        }
        yield "dropped_total", sum(counts.values())
        for reason, count in counts.items():
            yield f"dropped/{reason}", count
    nodes = [n for n in (record.get("nodes") or {}).values() if isinstance(n, dict)]
    if nodes:
        per: dict[str, list[float]] = defaultdict(list)
        for n in nodes:
            for key, value in n.items():
                if (v := _number(value)) is not None:
                    per[key].append(v)
        for key, values in per.items():
            total = sum(values)
            yield f"nodes/{key}", total if key in _NODE_SUMS else total / len(values)
    for key, value in (record.get("metrics") or {}).items():
        if key in ("reward", "samples"):  # the dataflow's own figures say the same
            continue
        if (v := _number(value)) is not None:
            yield key, v


def run_series(records: list[dict]) -> RunSeries:
    """Every figure of ``records`` (``metrics.jsonl``, in order) as grouped series."""
    from astraflow.launch.report import metric_series

    series: dict[str, Series] = {}

    def get(key: str) -> Series:
        if key not in series:
            series[key] = Series(key, group_of(key), TITLES.get(key, key))
        return series[key]

    for r in records:
        if r.get("type") != "step" or _number(r.get("step")) is None:
            continue
        policy = str(r.get("policy", "policy"))
        for key, value in _step_figures(r):
            get(key).add(policy, r["step"], value)
    for policy, (xs, ys) in metric_series(records, "step", "samples_per_s").items():
        for x, y in zip(xs, ys, strict=True):
            get("samples_per_s").add(policy, x, y)

    evals = [r for r in records if r.get("type") == "eval" and _number(r.get("step")) is not None]

    def where(r: dict) -> str:
        return f"{r.get('task_set', '')}:{r.get('split', '')}".strip(":")

    several = len({where(r) for r in evals}) > 1  # one accuracy chart per task set and split
    errored: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in evals:
        policy = str(r.get("policy", "policy"))
        if errored_eval(r):
            errors = int(_number(r.get("errors")) or 0)
            errored[policy].append({"step": r["step"], "task_set": where(r), "errors": errors})
            continue
        if (acc := _number(r.get("accuracy"))) is not None:
            key = f"accuracy/{where(r)}" if several else "accuracy"
            if key not in series:
                series[key] = Series(key, "learning", f"held-out accuracy (greedy) {where(r)}")
            series[key].add(policy, r["step"], acc)

    groups: dict[str, list[Series]] = {g: [] for g in GROUPS}
    for s in series.values():
        groups[s.group].append(s)
    first = ("reward_mean", "accuracy", "loss", "samples_per_s", "staleness_mean")
    for g in groups.values():
        g.sort(key=lambda s: (first.index(s.key) if s.key in first else len(first), s.key))
    return RunSeries(groups, dict(errored))
