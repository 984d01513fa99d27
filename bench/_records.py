"""Reading a run's ``metrics.jsonl``: step and evaluation records, time to an accuracy, trainer
idle time, missing final evaluations.

Pure functions over the records a run wrote, unit-tested on synthetic records
(``tests/bench/test_harness.py``) without a run.

Clock conventions (the same for every system, so comparisons are like for like):

Clock conventions (the same for every system, so comparisons are like for like):

* ``t0`` (training start) is the first moment a system does training work: for an AstraFlow run the
  earlier of the first weight version (the trainer published version 0, i.e. it is ready) and the
  first rollout lease issued; for the TRL baseline ``on_train_begin``. Process start-up (imports,
  model loading, spawning services) is reported separately as ``startup_s``.
* An evaluation at step ``s`` is placed at the time the weights of step ``s`` existed (the step's
  acknowledgement for AstraFlow, the end of the optimizer step for TRL), not at the time the
  evaluation finished: AstraFlow evaluates on rollout nodes while training continues, TRL evaluates
  in a callback that stops training, and neither latency says anything about training speed.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def parse_jsonl(text: str) -> list[dict[str, Any]]:
    """Records of a JSON-lines text; blank lines and a line cut by a crash are skipped."""
    records = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            records.append(value)
    return records


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    path = Path(path)
    return parse_jsonl(path.read_text(encoding="utf-8", errors="replace")) if path.exists() else []


@dataclass(frozen=True)
class EvalPoint:
    """Held-out accuracy of the weights of ``step``, reached ``t`` seconds after training start."""

    step: int
    t: float
    accuracy: float


def policies_in(records: Iterable[dict[str, Any]]) -> list[str]:
    return sorted({str(r.get("policy")) for r in records if r.get("policy") is not None})


def step_records(records: Iterable[dict[str, Any]], policy: str) -> list[dict[str, Any]]:
    """The policy's step records in step order (a repeated step keeps its last record)."""
    by_step: dict[int, dict[str, Any]] = {}
    for r in records:
        if r.get("type") == "step" and r.get("policy") == policy and r.get("step") is not None:
            by_step[int(r["step"])] = r
    return [by_step[s] for s in sorted(by_step)]


def step_times(records: Iterable[dict[str, Any]], policy: str) -> dict[int, float]:
    """step -> absolute time the step was committed (``time`` of its step record)."""
    return {int(r["step"]): float(r["time"]) for r in step_records(records, policy) if "time" in r}


def eval_points(records: Sequence[dict[str, Any]], policy: str, t0: float) -> list[EvalPoint]:
    """The policy's evaluations as (step, seconds after ``t0``, accuracy), in step order.

    Each evaluation is placed at the commit time of the step it evaluated (step 0 at ``t0``); an
    evaluation whose step has no step record (should not happen) falls back to its own ``time``.
    """
    times = step_times(records, policy)
    by_step: dict[int, EvalPoint] = {}
    for r in records:
        if r.get("type") != "eval" or r.get("policy") != policy:
            continue
        acc = r.get("accuracy")
        if acc is None or r.get("step") is None:
            continue
        step = int(r["step"])
        if step == 0:
            t = 0.0
        elif step in times:
            t = times[step] - t0
        else:
            t = float(r.get("time", t0)) - t0
        by_step[step] = EvalPoint(step, max(0.0, t), float(acc))
    return [by_step[s] for s in sorted(by_step)]


def time_to_accuracy(points: Sequence[EvalPoint], threshold: float) -> float | None:
    """Seconds until the first evaluation at or above ``threshold``; None if never reached."""
    for p in sorted(points, key=lambda p: (p.t, p.step)):
        if p.accuracy >= threshold - 1e-12:
            return p.t
    return None


def idle_fraction(intervals: Sequence[tuple[float, float]]) -> float | None:
    """Share of the training window a trainer spent waiting for data.

    ``intervals`` are (batch served, batch acknowledged) times of one trainer, i.e. the spans it was
    working on a batch. Idle time is every gap between one acknowledgement and the next batch being
    served (the trainer is blocked in the batch long-poll); the window runs from the first batch
    served to the last acknowledgement. Start-up before the first batch is not counted.
    """
    spans = sorted((float(a), float(b)) for a, b in intervals if a is not None and b is not None)
    if not spans:
        return None
    window = spans[-1][1] - spans[0][0]
    if window <= 0:
        return None
    idle = 0.0
    for (_, prev_ack), (served, _) in zip(spans, spans[1:], strict=False):
        idle += max(0.0, served - prev_ack)
    return min(1.0, idle / window)


def mean_reward(records: Sequence[dict[str, Any]], last: int | None = None) -> float | None:
    vals = [float(r["reward_mean"]) for r in records if r.get("reward_mean") is not None]
    if last is not None:
        vals = vals[-last:]
    return statistics.fmean(vals) if vals else None


def missing_final_evals(records: Sequence[dict[str, Any]]) -> dict[str, tuple[int, float]]:
    """policy -> (last step, its time) for each policy whose last step has no evaluation.

    The trainer requests an evaluation of its final version, but the run can end before the
    rollout nodes have run it; the benchmark then evaluates the final checkpoint itself.
    """
    out: dict[str, tuple[int, float]] = {}
    for policy in policies_in(records):
        steps = step_records(records, policy)
        if not steps:
            continue
        last = int(steps[-1]["step"])
        evaluated = {
            int(r["step"])
            for r in records
            if r.get("type") == "eval"
            and r.get("policy") == policy
            and r.get("accuracy") is not None
            and r.get("step") is not None
        }
        if last not in evaluated:
            out[policy] = (last, float(steps[-1].get("time", 0.0)))
    return out


def run_summary(records: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The last ``run_summary`` record: what the dataflow service writes as it stops (its final
    status document under ``status``, plus figures only its store holds). A restarted service
    writes one per life; the last describes the whole run. None for a run without one."""
    found = [r for r in records if r.get("type") == "run_summary"]
    return found[-1] if found else None


@dataclass
class DataflowTimes:
    """The dataflow's clock of a finished run, from its ``run_summary`` record."""

    first_version: float | None = None
    first_lease: float | None = None
    #: policy -> (batch served, batch done with) times, in serving order
    batches: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    episodes: int = 0
    train_episodes: int = 0

    @property
    def training_start(self) -> float | None:
        times = [t for t in (self.first_version, self.first_lease) if t is not None]
        return min(times) if times else None


def dataflow_times(records: Sequence[dict[str, Any]]) -> DataflowTimes:
    """:class:`DataflowTimes` from the run's last ``run_summary`` record (empty without one)."""
    summary = run_summary(records)
    if summary is None:
        return DataflowTimes()
    return DataflowTimes(
        first_version=summary.get("first_version_at"),
        first_lease=summary.get("first_lease_at"),
        batches={
            p: [(float(a), float(b)) for a, b in spans]
            for p, spans in (summary.get("batches") or {}).items()
        },
        episodes=int((summary.get("status") or {}).get("episodes", 0)),
        train_episodes=int(summary.get("train_episodes") or 0),
    )
