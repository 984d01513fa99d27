"""What a run achieved: one :class:`RunResult` per system and seed, one :class:`PolicyResult` per
policy, built from the run's metrics records; and the per-system figures every comparison reports."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from _records import EvalPoint, eval_points, idle_fraction, mean_reward, step_records
from _stats import ratio, spread, spread_json


@dataclass
class PolicyResult:
    """What one policy of one run achieved (the unit every table row is built from)."""

    policy: str
    steps: int = 0
    trained_samples: int = 0
    train_s: float | None = None
    samples_per_s: float | None = None
    evals: list[EvalPoint] = field(default_factory=list)
    reward_first: float | None = None
    reward_final: float | None = None
    idle_fraction: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def accuracy_before(self) -> float | None:
        return self.evals[0].accuracy if self.evals and self.evals[0].step == 0 else None

    @property
    def accuracy_final(self) -> float | None:
        return self.evals[-1].accuracy if self.evals else None

    @property
    def accuracy_best(self) -> float | None:
        return max((p.accuracy for p in self.evals), default=None)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["evals"] = [asdict(p) for p in self.evals]
        out["accuracy_before"] = self.accuracy_before
        out["accuracy_final"] = self.accuracy_final
        out["accuracy_best"] = self.accuracy_best
        return out


@dataclass
class RunResult:
    """One run of one system with one seed."""

    system: str
    seed: int
    ok: bool
    wall_s: float
    startup_s: float | None = None
    error: str | None = None
    run_dir: str | None = None
    t0: float | None = None  # absolute training-start time (epoch seconds)
    policies: dict[str, PolicyResult] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunResult:
        """Inverse of :meth:`to_json` (re-analysing saved runs without running them again)."""
        run = cls(
            data["system"], data["seed"], data["ok"], data["wall_s"], data.get("startup_s"),
            data.get("error"), data.get("run_dir"), data.get("t0"),
        )  # fmt: skip
        for name, p in data.get("policies", {}).items():
            run.policies[name] = PolicyResult(
                name, p["steps"], p["trained_samples"], p.get("train_s"), p.get("samples_per_s"),
                [EvalPoint(**e) for e in p.get("evals", [])], p.get("reward_first"),
                p.get("reward_final"), p.get("idle_fraction"), p.get("extra", {}),
            )  # fmt: skip
        return run

    def to_json(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "seed": self.seed,
            "ok": self.ok,
            "wall_s": self.wall_s,
            "startup_s": self.startup_s,
            "t0": self.t0,
            "error": self.error,
            "run_dir": self.run_dir,
            "policies": {k: v.to_json() for k, v in self.policies.items()},
        }


class RunJournal:
    """Finished runs appended to a JSON-lines file as they end, so that a bench of hours stopped
    part-way (a session ending, a crash) continues where it was instead of starting over.

    The first line holds the bench's settings; a journal written under other settings is refused
    (its runs would not be comparable), except for the number of seeds: a run of 8 seeds stopped
    after 5 reports its 5 with ``--seeds 5``. Each further line is one run: ``{"case", "run"}``."""

    def __init__(self, path: Path, settings: dict[str, Any]) -> None:
        self.path = path
        self._done: dict[tuple[str, str, int], RunResult] = {}
        #: every failed or timed-out attempt, in order (:func:`failure_entry`); kept for the JSON
        self.failures: list[dict[str, Any]] = []
        header = json.loads(json.dumps({"settings": settings}))  # as it reads back
        if path.exists() and path.stat().st_size:
            first, *rest = path.read_text().splitlines()
            if _without_seeds(json.loads(first)) != _without_seeds(header):
                raise SystemExit(
                    f"{path} was written under other settings; remove it or pass another "
                    f"--journal path (it holds {json.loads(first)['settings']})"
                )
            for line in rest:
                if line.strip():
                    rec = json.loads(line)
                    run = RunResult.from_json(rec["run"])
                    if rec.get("failed"):
                        self.failures.append(failure_entry(rec["case"], run))
                        continue
                    self._done[(rec["case"], run.system, run.seed)] = run
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(header) + "\n")

    def __len__(self) -> int:
        return len(self._done)

    def run(self, case: str, system: str, seed: int, job: Callable[[], RunResult]) -> RunResult:
        """The journal's run of ``(case, system, seed)`` when it finished before, else ``job()``.

        Every outcome is recorded: a success is reused next time; a failure (a crash, a
        timeout) is written with ``"failed": true`` and tried again next time, but it stays in
        :attr:`failures`, which the bench writes into its JSON (``failed_runs``): a failure is
        never re-run silently."""
        done = self._done.get((case, system, seed))
        if done is not None:
            return done
        result = job()
        line: dict[str, Any] = {"case": case, "run": result.to_json()}
        if not result.ok:
            line["failed"] = True
            self.failures.append(failure_entry(case, result))
        with self.path.open("a") as f:
            f.write(json.dumps(line) + "\n")
        if result.ok:
            self._done[(case, system, seed)] = result
        return result


def failure_entry(case: str, run: RunResult) -> dict[str, Any]:
    """One failed attempt as the JSON's ``failed_runs`` lists it: which run, whether it timed
    out (the harness's "killed after" / "timed out"), its wall time and its error's first line."""
    error = (run.error or "failed without an error message").strip()
    first = error.splitlines()[0] if error else ""
    return {
        "case": case,
        "system": run.system,
        "seed": run.seed,
        "timed_out": "killed after" in error or "timed out" in error.lower(),
        "wall_s": run.wall_s,
        "error": first[:300],
    }


def _without_seeds(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_seeds(v) for k, v in value.items() if k != "seeds"}
    return value


def successful_runs(runs: Iterable[RunResult], order: Sequence[str]) -> dict[str, list[RunResult]]:
    """The runs that completed with a ``policy`` result, by system, for every system of ``order``
    that has a run at all (a system whose runs all failed keeps an empty list: it is reported)."""
    runs = list(runs)
    present = [s for s in order if any(r.system == s for r in runs)]
    by_system: dict[str, list[RunResult]] = {s: [] for s in present}
    for r in runs:
        if r.ok and "policy" in r.policies:
            by_system[r.system].append(r)
    return by_system


def throughput_json(runs: Sequence[RunResult], startup: bool = False) -> dict[str, Any]:
    """The figures every comparison reports per system, as :func:`spread_json` over its
    successful runs: run count, wall (and start-up) seconds, training seconds, samples/s."""
    ps = [r.policies["policy"] for r in runs]
    return {
        "runs": len(ps),
        "wall_s": spread_json(spread(r.wall_s for r in runs)),
        **({"startup_s": spread_json(spread(r.startup_s for r in runs))} if startup else {}),
        "train_s": spread_json(spread(p.train_s for p in ps)),
        "samples_per_s": spread_json(spread(p.samples_per_s for p in ps)),
        "trained_samples": spread_json(spread(p.trained_samples for p in ps)),
    }


def summarize_policy(
    records: Sequence[dict[str, Any]],
    policy: str,
    t0: float,
    intervals: Sequence[tuple[float, float]] = (),
    reward_window: int = 5,
) -> PolicyResult:
    """A :class:`PolicyResult` from metrics records (AstraFlow's metrics.jsonl format)."""
    steps = step_records(records, policy)
    res = PolicyResult(policy)
    res.steps = len(steps)
    res.trained_samples = int(sum(int(r.get("samples") or 0) for r in steps))
    if steps and "time" in steps[-1]:
        res.train_s = float(steps[-1]["time"]) - t0
        res.samples_per_s = ratio(res.trained_samples, res.train_s)
    res.evals = eval_points(records, policy, t0)
    res.reward_first = mean_reward(steps[:reward_window])
    res.reward_final = mean_reward(steps, last=reward_window)
    res.idle_fraction = idle_fraction(intervals) if intervals else None
    waits = [(r.get("metrics") or {}).get("batch_wait_s") for r in steps]
    if steps and all(isinstance(w, (int, float)) for w in waits) and res.train_s:
        # The trainer's own account (time blocked in the batch pull), as a cross-check of the
        # store-derived idle fraction above.
        res.extra["idle_fraction_reported"] = min(1.0, sum(waits) / res.train_s)
    staleness = [r["staleness_mean"] for r in steps if r.get("staleness_mean") is not None]
    if staleness:
        res.extra["staleness_mean"] = statistics.fmean(staleness)
    return res
