"""Shared machinery of the comparison benchmarks (``vs_trl``, ``agentic``, ``multi_policy``).

Why a harness of its own: the benchmarks run the real system (``astraflow train RECIPE`` as a
subprocess, exactly as a user would) and a baseline, then compare them from what the runs wrote to
disk. Everything that turns those files into numbers (time to a held-out accuracy, trainer idle
fraction, medians and spreads) is a pure function here, so it is unit-tested on synthetic records
(``tests/test_bench_harness.py``) without a run.

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
import math
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

REPO_ROOT = Path(__file__).resolve().parents[2]
#: Wide enough for the result tables when the output is a file or a pipe (CI logs, ``| tee``).
console = Console(width=None if sys.stdout.isatty() else 160)


# ----------------------------------------------------------------------------- records


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


# ----------------------------------------------------------------------------- run summaries


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


def mean_reward(records: Sequence[dict[str, Any]], last: int | None = None) -> float | None:
    vals = [float(r["reward_mean"]) for r in records if r.get("reward_mean") is not None]
    if last is not None:
        vals = vals[-last:]
    return statistics.fmean(vals) if vals else None


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


# ----------------------------------------------------------------------------- AstraFlow runs


@dataclass
class DataflowTimes:
    """Timestamps read back from a finished run's dataflow store (read-only)."""

    first_version: float | None = None
    first_lease: float | None = None
    batches: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    episodes: int = 0
    train_episodes: int = 0

    @property
    def training_start(self) -> float | None:
        times = [t for t in (self.first_version, self.first_lease) if t is not None]
        return min(times) if times else None


def read_dataflow_times(db_path: Path) -> DataflowTimes:
    """Version, lease and batch timestamps from ``dataflow.db`` (opened read-only)."""
    out = DataflowTimes()
    if not Path(db_path).exists():
        return out
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=10.0)
    try:
        out.first_version = conn.execute("SELECT MIN(created_at) FROM versions").fetchone()[0]
        out.first_lease = conn.execute("SELECT MIN(issued_at) FROM leases").fetchone()[0]
        for policy, created, acked in conn.execute(
            "SELECT policy, created_at, acked_at FROM batches WHERE acked_at IS NOT NULL "
            "ORDER BY created_at"
        ):
            out.batches.setdefault(policy, []).append((float(created), float(acked)))
        out.episodes = conn.execute("SELECT COUNT(*) FROM episodes").fetchone()[0]
        out.train_episodes = conn.execute(
            "SELECT COUNT(*) FROM episodes WHERE is_eval = 0"
        ).fetchone()[0]
    except sqlite3.Error as exc:  # a store from another schema version: report, don't crash
        console.print(f"[yellow]could not read {db_path}: {exc}[/]")
    finally:
        conn.close()
    return out


#: ``final_eval(run_dir, policy, step) -> accuracy | None`` for a run whose final eval is missing.
FinalEval = Callable[[Path, str, int], "float | None"]


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


def _bench_eval(policy: str, step: int, accuracy: float, at: float) -> dict[str, Any]:
    return {
        "type": "eval",
        "policy": policy,
        "step": step,
        "accuracy": accuracy,
        "time": at,
        "source": "bench",
    }


def _log_tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def stop_process_group(proc: subprocess.Popen, grace_s: float = 60.0) -> None:
    """SIGTERM the process (the launcher stops its services in order), then SIGKILL its group.

    The launcher's services run in sessions of their own but die with it (PR_SET_PDEATHSIG), so
    killing the launcher's group leaves nothing behind.
    """
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass


def child_env(threads: int = 1, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "OMP_NUM_THREADS": str(threads),
            "MKL_NUM_THREADS": str(threads),
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
        }
    )
    env.update(extra or {})
    return env


@dataclass
class ProcessOutcome:
    returncode: int | None
    wall_s: float
    started: float
    timed_out: bool
    stopped_when_finished: bool = False


def run_subprocess(
    argv: list[str],
    log_path: Path,
    timeout_s: float,
    env: dict[str, str] | None = None,
    finished: Callable[[], bool] | None = None,
    poll_s: float = 1.0,
) -> ProcessOutcome:
    """Run ``argv`` in its own process group with output to ``log_path``; never leaves it behind.

    ``finished()`` (polled every ``poll_s``) says the work the benchmark measures is complete;
    the process is then stopped (SIGTERM, as Ctrl-C would) instead of being waited for, and the
    outcome says ``stopped_when_finished``.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.time()
    stopped = False
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            argv,
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env or child_env(),
            start_new_session=True,
        )
        timed_out = False
        try:
            deadline = started + timeout_s
            while proc.poll() is None:
                if time.time() > deadline:
                    timed_out = True
                    break
                if finished is not None and finished():
                    stopped = True
                    break
                try:
                    proc.wait(poll_s)
                except subprocess.TimeoutExpired:
                    pass
        except BaseException:  # Ctrl-C in the benchmark: stop the run, then re-raise
            stop_process_group(proc)
            raise
        finally:
            stop_process_group(proc, grace_s=60.0 if (timed_out or stopped) else 5.0)
    return ProcessOutcome(proc.returncode, time.time() - started, started, timed_out, stopped)


def training_finished(
    metrics_path: Path, policies: Sequence[str], max_steps: int, eval_grace_s: float
) -> Callable[[], bool]:
    """A ``finished()`` for :func:`run_subprocess`: every policy has committed ``max_steps``, and
    its final evaluation is recorded or ``eval_grace_s`` has passed since training ended.

    Why: the launcher may wait minutes for final evaluations that cannot run (e.g. a rollout node
    that can no longer fetch the final weights once their trainer has exited); the benchmark
    measures training, and evaluates a missing final checkpoint itself.
    """
    state: dict[str, float] = {}

    def finished() -> bool:
        records = read_jsonl(metrics_path)
        last = {p: max((r["step"] for r in step_records(records, p)), default=0) for p in policies}
        if any(last[p] < max_steps for p in policies):
            return False
        state.setdefault("trained_at", time.time())
        evaluated = all(
            any(
                r.get("type") == "eval" and r.get("policy") == p and r.get("step") == last[p]
                for r in records
            )
            for p in policies
        )
        return evaluated or time.time() - state["trained_at"] > eval_grace_s

    return finished


def run_recipe(
    recipe: Path,
    overrides: list[str],
    *,
    system: str,
    seed: int,
    workdir: Path,
    timeout_s: float,
    final_eval: FinalEval | None = None,
    eval_grace_s: float = 30.0,
) -> RunResult:
    """``astraflow train RECIPE --no-live --set ...`` in a subprocess, summarised per policy.

    ``final_eval(run_dir, policy, step)`` supplies the held-out accuracy of the final checkpoint
    when the run's own final evaluation is missing (see :func:`missing_final_evals`). The run is
    stopped ``eval_grace_s`` after its last optimizer step if the final evaluations have not
    come in by then (:func:`training_finished`).

    The run goes to a fresh ``workdir/<system>-s<seed>`` output dir (so the run directory name is
    the recipe's). ``timeout_s`` is passed to the launcher (it stops its services itself) and is
    enforced again from here with a margin.
    """
    output_dir = workdir / f"{system}-s{seed}"
    output_dir.mkdir(parents=True, exist_ok=True)
    sets = [f"run.output_dir={json.dumps(str(output_dir))}", f"run.seed={seed}", *overrides]
    argv = [sys.executable, "-m", "cli.main", "train", str(recipe), "--no-live"]
    argv += ["--timeout", str(int(timeout_s))]
    for s in sets:
        argv += ["--set", s]
    log_path = workdir / f"{system}-s{seed}.log"
    from astraflow.recipe import load_recipe

    resolved = load_recipe(recipe, sets)
    finished = training_finished(
        resolved.run.run_dir / "metrics.jsonl",
        resolved.trainable_policies(),
        resolved.run.max_steps,
        eval_grace_s,
    )
    outcome = run_subprocess(argv, log_path, timeout_s + 120.0, finished=finished)
    run_dirs = sorted(p.parent for p in output_dir.glob("*/recipe.toml"))
    run_dir = run_dirs[0] if run_dirs else None
    result = RunResult(system, seed, ok=False, wall_s=outcome.wall_s)
    result.run_dir = str(run_dir) if run_dir else None
    problems = []
    if outcome.timed_out:
        problems.append(f"killed after {timeout_s + 120:.0f}s")
    elif outcome.stopped_when_finished:
        pass  # stopped by the benchmark once training (and the final evals, or their grace) ended
    elif outcome.returncode != 0:
        problems.append(f"`astraflow train` exited with status {outcome.returncode}")
    if run_dir is None:
        problems.append(f"no run directory under {output_dir}")
        result.error = "; ".join(problems) + "\n" + _log_tail(log_path)
        return result
    records = read_jsonl(run_dir / "metrics.jsonl")
    times = read_dataflow_times(run_dir / "dataflow.db")
    t0 = times.training_start
    if t0 is None:
        t0 = min((float(r["time"]) for r in records if "time" in r), default=outcome.started)
    result.startup_s = t0 - outcome.started
    result.t0 = t0
    missing = missing_final_evals(records)
    added: set[str] = set()
    if final_eval is not None:
        for policy, (last_step, last_time) in missing.items():
            acc = final_eval(run_dir, policy, last_step)
            if acc is not None:
                records.append(_bench_eval(policy, last_step, acc, last_time))
                added.add(policy)
    for policy in policies_in(records):
        res = summarize_policy(records, policy, t0, times.batches.get(policy, []))
        res.extra["episodes"] = times.train_episodes
        if policy in missing:
            res.extra["final_eval"] = "by the bench" if policy in added else "missing"
        result.policies[policy] = res
    if not any(p.steps for p in result.policies.values()):
        problems.append("no training step recorded in metrics.jsonl")
    if problems:
        tail = _log_tail(log_path)
        for svc_log in sorted((run_dir / "logs").glob("*.log")):
            if "Traceback" in svc_log.read_text(errors="replace"):
                tail += f"\n--- {svc_log.name} ---\n" + _log_tail(svc_log)
        result.error = "; ".join(problems) + "\n" + tail
    result.ok = not problems
    return result


# ----------------------------------------------------------------------------- evaluation


def greedy_accuracy(model, tokenizer, problems, max_tokens: int, score) -> float:
    """Greedy held-out accuracy: chat-template prompts, ``max_tokens`` new tokens, env scoring.

    The same decoding as AstraFlow's evaluation tasks (greedy, the policy's ``max_tokens``, the
    tiny model's chat template, special tokens skipped when decoding) and the same reward.
    """
    import torch

    prompts = []
    for p in problems:
        enc = tokenizer.apply_chat_template(
            [{"role": "user", "content": p["question"]}], tokenize=True, add_generation_prompt=True
        )
        prompts.append(list(enc["input_ids"] if hasattr(enc, "keys") else enc))
    was_training = model.training
    model.eval()
    correct = 0.0
    with torch.no_grad():
        for start in range(0, len(prompts), 150):
            chunk = prompts[start : start + 150]
            ids, mask = left_pad(chunk, tokenizer.pad_token_id)
            width = ids.shape[1]
            gen = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=max_tokens,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            texts = tokenizer.batch_decode(gen[:, width:], skip_special_tokens=True)
            for p, text in zip(problems[start : start + 150], texts, strict=True):
                correct += score(p["question"], p["answer"], text)
    if was_training:
        model.train()
    return correct / len(problems)


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int):
    """``(input_ids, attention_mask)`` of token lists padded on the left to one width: the batch
    layout ``generate`` continues from (every prompt ends at the last column)."""
    import torch

    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, width - len(s) :] = torch.tensor(s)
        mask[i, width - len(s) :] = 1
    return ids, mask


def env_scorer(env_id: str, env_kwargs: dict[str, Any]):
    """``score(question, answer, text)``: the recipe env's reward for ``text`` (Math env)."""
    from envs.registry import make_env

    env = make_env(env_id, **env_kwargs)

    def score(question: str, answer: str, text: str) -> float:
        env.reset(options={"task": {"question": question, "answer": answer}})
        _, reward, *_ = env.step(text)
        return float(reward)

    return score


def checkpoint_accuracy(settings: dict[str, Any], seed: int, policies: Iterable[str] | None = None):
    """A :data:`FinalEval` that evaluates ``run_dir/checkpoints/POLICY/checkpoint-STEP`` greedily
    on the same held-out problems as the runs' own evaluations (single-answer math policies).

    ``settings``: env, env_kwargs, task_set, eval_split, eval_tasks, max_tokens. ``policies``
    limits it to the policies whose held-out metric is exactly that (e.g. a solver, not a
    verifier); others return None and stay marked as missing.
    """
    allowed = None if policies is None else set(policies)

    def final_eval(run_dir: Path, policy: str, step: int) -> float | None:
        if allowed is not None and policy not in allowed:
            return None
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        from astraflow.models import load_tokenizer

        hf_logging.disable_progress_bar()  # keep the benchmark's own output readable
        from tasks.catalog import load_task_set

        ckpt = Path(run_dir) / "checkpoints" / policy / f"checkpoint-{step}"
        if not (ckpt / "config.json").exists():
            console.print(f"[yellow]no checkpoint at {ckpt}: final accuracy left out[/]")
            return None
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
            tokenizer = load_tokenizer(ckpt)
            tokenizer.padding_side = "left"
            problems = load_task_set(
                settings["task_set"], settings["eval_split"], seed=seed,
                limit=settings["eval_tasks"],
            )  # fmt: skip
            score = env_scorer(settings["env"], settings["env_kwargs"])
            return greedy_accuracy(model, tokenizer, problems, settings["max_tokens"], score)
        finally:
            torch.set_num_threads(threads)

    return final_eval


# ----------------------------------------------------------------------------- output


def fmt(value: float | None, spec: str = "{:.2f}", unit: str = "") -> str:
    return "-" if value is None else spec.format(value) + unit


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    t = Table(title=title, title_justify="left")
    for i, col in enumerate(columns):
        t.add_column(col, justify="left" if i == 0 else "right")
    for row in rows:
        t.add_row(*row)
    return t


def spread_text(d: dict[str, Any], spec: str = "{:.1f}", unit: str = "") -> str:
    """A :func:`spread_json` dict as table text (median [min–max])."""
    return Spread(d["median"], d["min"], d["max"], d["n"]).text(spec, unit)


def print_ladder(title: str, systems: Sequence[str], ladder: dict[str, dict[str, Any]]) -> None:
    """The table of median seconds to each accuracy level (``ladder[level][system]``)."""
    if not ladder:
        return
    rows = [[lvl, *(fmt(t.get(s), "{:.0f}", "s") for s in systems)] for lvl, t in ladder.items()]
    console.print(table(title, ["accuracy", *systems], rows))


def print_failures(runs: Iterable[RunResult], notes: Iterable[str]) -> None:
    """A report's end: the error of every failed run, then the benchmark's notes."""
    for r in runs:
        if not r.ok:
            console.print(f"[red]{r.system} seed {r.seed} failed:[/] {r.error}")
    for note in notes:
        console.print(f"[dim]- {note}[/]")


def parse_systems(ap, text: str, known: Sequence[str]) -> list[str]:
    """``--systems``: a comma-separated subset of ``known`` (an argparse error otherwise)."""
    systems = [s.strip() for s in text.split(",") if s.strip()]
    unknown = set(systems) - set(known)
    if unknown:
        ap.error(f"--systems: unknown {sorted(unknown)}; expected some of {', '.join(known)}")
    return systems


def write_json(path: Path | str, payload: dict[str, Any]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=_jsonable) + "\n", encoding="utf-8")
    return path


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (EvalPoint, Spread)):
        return asdict(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def spread_json(s: Spread) -> dict[str, Any]:
    return {"median": s.median, "min": s.lo, "max": s.hi, "n": s.n}


@contextmanager
def bench_workdir(path: Path | None, prefix: str) -> Iterator[Path]:
    """Where a benchmark's runs go: ``path`` (kept, created if needed) or a temporary folder
    removed afterwards (the runs are large; the JSON results are what is kept)."""
    if path is not None:
        path = path.resolve()
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield Path(tmp)


def run_logged(
    label: str, run: Callable[[], RunResult], figures: Callable[[PolicyResult | None], str] | None
) -> RunResult:
    """``run()`` under a status line, then one line of outcome: ok or failed, wall seconds and
    ``figures(result's "policy")`` (the bench's headline numbers for that run)."""
    with console.status(f"running {label}…"):
        started = time.time()
        result = run()
    status = "[green]ok[/]" if result.ok else "[red]failed[/]"
    tail = f", {figures(result.policies.get('policy'))}" if figures else ""
    console.print(f"{status} {label}: {time.time() - started:.0f}s{tail}")
    return result


# ----------------------------------------------------------------------------- plots


def plot_safely(draw: Callable[[], Path | None]) -> Path | None:
    """``draw()``, reporting the plot's path; a failure is reported, never raised: the numbers
    matter more than the picture."""
    try:
        path = draw()
    except Exception as exc:  # noqa: BLE001 - see the docstring
        console.print(f"[yellow]plot failed: {exc}[/]")
        return None
    if path:
        console.print(f"plot: {path}")
    return path


def save_figure(fig, path: Path) -> Path:
    """Lay out, write (PNG, folders created) and close a matplotlib figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_accuracy(
    runs: Sequence[RunResult], path: Path, colours: dict[str, str], title: str, xlabel: str,
    symlog: bool = False, **line: Any,
) -> Path | None:  # fmt: skip
    """Held-out accuracy of policy ``policy`` against training time, one line per successful run,
    one colour (and legend entry) per system; None when no run has an evaluation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    labelled: set[str] = set()
    for r in runs:
        p = r.policies.get("policy")
        if not r.ok or p is None or not p.evals:
            continue
        label = None if r.system in labelled else r.system
        labelled.add(r.system)
        ax.plot([e.t for e in p.evals], [e.accuracy for e in p.evals], color=colours[r.system],
                alpha=0.75, lw=1.2, label=label, **line)  # fmt: skip
    if not labelled:
        plt.close(fig)
        return None
    if symlog:
        ax.set_xscale("symlog", linthresh=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("held-out greedy accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return save_figure(fig, path)
