"""Launching the runs a benchmark measures: ``astraflow train RECIPE`` (or any command) in its own
process group, stopped when the measured work is done, never left behind; and where runs go.

Why a subprocess: the benchmarks run the real system exactly as a user would, then compare runs
from what they wrote to disk (``_records``, ``_results``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _records import dataflow_times, missing_final_evals, policies_in, read_jsonl, step_records
from _report import console
from _results import PolicyResult, RunResult, summarize_policy

REPO_ROOT = Path(__file__).resolve().parents[1]


#: ``final_eval(run_dir, policy, step) -> accuracy | None`` for a run whose final eval is missing.
FinalEval = Callable[[Path, str, int], "float | None"]


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
    argv = [sys.executable, "-m", "astraflow.cli.main", "train", str(recipe), "--no-live"]
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
    times = dataflow_times(records)
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
