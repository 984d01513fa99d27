"""Chaos: real quickstart-size runs while a seeded schedule SIGKILLs or SIGSTOPs their services.

Each run is ``astraflow train recipes/quickstart.toml`` (small: a few steps, two rollout nodes,
evaluations on), started exactly as a user would. Once training is under way a seeded schedule
picks a moment, a service (the dataflow, the trainer or a node) and a fault: SIGKILL (the launcher
must restart it) or SIGSTOP for a few seconds then SIGCONT (everyone else must ride it out). After
the run, the invariants are checked from what it left on disk:

* the run completed (exit 0) and the final version is ``max_steps``: in the dataflow's run summary
  (the last record of metrics.jsonl), in the weight store, and in the last step record; version == step for every step record;
* the step records are 1..max_steps, once each, and each names a different batch; no sample was
  trained twice in the final timeline (no sample id in two acknowledged batches);
* no task was lost: every training task is done, pending, or leased under a live lease;
* no evaluation from a discarded timeline: each evaluated version was measured after the final
  timeline's announcement of that version, once.

    python bench/chaos.py --quick --json out.json     # 2 runs, < 2 min on 2 cores... ish
    python bench/chaos.py --runs 5 --json out.json

JSON keys: ``runs``, ``kills``, ``stops``, ``restarts``, ``runs_completed``,
``invariant_violations`` (must be 0), ``steps_final`` (the final version of each run), and
``violations`` (what was wrong, per run).

Then the episode trial, with and without saved episodes (``rollout.checkpoint_after_s``): a
dataflow service and a rollout node (``tests/rollout/scripted_node.py``: the real node with a
scripted engine that counts the turns it generates) play multi-turn math episodes (6 turns each,
0.4 s of tool latency per turn); the node is SIGKILLed once it has generated a fixed number of
turns (in the middle of its second group) and a second node finishes the run. JSON key
``episode_turns_redone`` (``checkpoints`` / ``no_checkpoints``): turns generated and thrown away,
i.e. every turn both nodes generated minus the turns of the episodes that were trained;
``episode_trials`` holds each trial's counts. ``--episodes-only`` runs just this trial.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import _records
import _stamp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "rollout"))
from node_helpers import Dataflow, multi_turn_recipe, start_node, wait_for  # noqa: E402
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
console = Console()

#: a quickstart small enough that a run with faults takes about a minute on 2 cores
SMALL = [
    "tasks.group_size=4",
    "policies.policy.trainer.groups_per_step=2",
    "policies.policy.trainer.checkpoint_every=3",
    "rollout.nodes=2",
    "rollout.concurrency=16",
    "evaluation.every_steps=3",
    "evaluation.num_tasks=16",
    "run.max_restarts=20",
    "run.restart_backoff_s=0.2",
]


@dataclass
class Fault:
    at_step: int  # once this step is recorded...
    delay_s: float  # ...and this long after it
    target: str  # dataflow | trainer-policy | node-0 | node-1
    kind: str  # kill | stop
    stop_s: float = 0.0


def schedule(rng: random.Random, faults: int, steps: int) -> list[Fault]:
    """``faults`` faults at random moments of training (steps 1..steps-1), in order. Moments are
    set by step, not by clock, so a fault lands during training however fast the machine is."""
    out = []
    for _ in range(faults):
        kind = "kill" if rng.random() < 0.7 else "stop"
        target = rng.choice(["dataflow", "trainer-policy", "node-0", "node-1"])
        at = rng.randint(1, max(1, steps - 1))
        out.append(Fault(at, rng.uniform(0.0, 0.5), target, kind, rng.uniform(2.0, 6.0)))
    return sorted(out, key=lambda f: (f.at_step, f.delay_s))


@dataclass
class RunOutcome:
    seed: int
    returncode: int | None
    wall_s: float
    faults: list[Fault]
    applied: list[str] = field(default_factory=list)
    restarts: int = 0
    steps_final: int | None = None
    violations: list[str] = field(default_factory=list)


def _metrics(run_dir: Path) -> list[dict]:
    return _records.read_jsonl(run_dir / "metrics.jsonl")


def _steps_done(run_dir: Path) -> int:
    return max((r["step"] for r in _metrics(run_dir) if r.get("type") == "step"), default=0)


def _pid(run_dir: Path, name: str) -> int | None:
    try:
        return json.loads((run_dir / "pids.json").read_text()).get(name)
    except (OSError, ValueError):
        return None


def _inject(run_dir: Path, faults: list[Fault], proc: subprocess.Popen, out: RunOutcome) -> None:
    """Apply each fault when its step is reached; every stopped process is continued."""
    timers: list[threading.Timer] = []
    for f in faults:
        while _steps_done(run_dir) < f.at_step:
            if proc.poll() is not None:
                return
            time.sleep(0.05)
        time.sleep(f.delay_s)
        pid = _pid(run_dir, f.target)
        if pid is None:
            continue
        try:
            if f.kind == "kill":
                os.kill(pid, signal.SIGKILL)
                out.applied.append(f"kill {f.target} at step {_steps_done(run_dir)}")
            else:
                os.kill(pid, signal.SIGSTOP)
                out.applied.append(
                    f"stop {f.target} {f.stop_s:.1f}s at step {_steps_done(run_dir)}"
                )
                # continued from a timer, so the next fault is not held up meanwhile
                timer = threading.Timer(f.stop_s, _continue, args=(pid,))
                timer.start()
                timers.append(timer)
        except ProcessLookupError:
            continue
    for timer in timers:
        timer.join()


def _continue(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def check_invariants(run_dir: Path, max_steps: int) -> tuple[int | None, list[str]]:
    """(final version, violations) from the run directory: store, weight store, metrics."""
    bad: list[str] = []
    records = _metrics(run_dir)
    steps = [r for r in records if r.get("type") == "step"]
    if [r["step"] for r in steps] != list(range(1, max_steps + 1)):
        bad.append(f"step records are {[r['step'] for r in steps]}, not 1..{max_steps}")
    if any(r.get("version") != r.get("step") for r in steps):
        bad.append("a step record's version differs from its step")
    ids = [r.get("batch_id") for r in steps]
    if len(ids) != len(set(ids)):
        bad.append("a batch appears in two step records")
    summary = _records.run_summary(records)
    if summary is None:
        return None, [*bad, "no run_summary record: the dataflow service did not stop cleanly"]
    announced_versions = summary["versions"].get("policy", [])
    final = max((v for v, _, _ in announced_versions), default=None)
    if final != max_steps:
        bad.append(f"final announced version {final}, expected {max_steps}")
    acked = summary["acked"].get("policy", [])
    if [s for s, _ in acked] != list(range(1, max_steps + 1)):
        bad.append(f"acknowledged steps in the store: {[s for s, _ in acked]}")
    if steps and [b for _, b in acked] != ids:
        bad.append("the store's acknowledged batches differ from the step records")
    audit = summary["audit"]
    if audit["samples_trained_twice"]:
        bad.append(f"{audit['samples_trained_twice']} sample(s) trained twice")
    lost = len(audit["lost"]["orphaned"])
    if lost:
        bad.append(f"{lost} training task(s) leased with no live lease (lost)")
    announced = {v: at for v, at, _ in announced_versions}
    evals = [r for r in records if r.get("type") == "eval" and r.get("policy") == "policy"]
    versions = [r["version"] for r in evals]
    if len(versions) != len(set(versions)):
        bad.append(f"a version was evaluated twice: {sorted(versions)}")
    for r in evals:
        at = announced.get(r["version"])
        # v0 is the initial model in every timeline (nodes may evaluate it before it is announced)
        if r["version"] > 0 and (at is None or r["time"] < at):
            bad.append(f"evaluation of v{r['version']} is from a discarded timeline")
    weights = run_dir / "weights" / "policy"
    stored = sorted(int(p.name[1:]) for p in weights.glob("v*") if p.name[1:].isdigit())
    if not stored or stored[-1] != max_steps:
        bad.append(f"weight store holds versions {stored[-3:]}, expected {max_steps} last")
    return final, bad


def run_once(workdir: Path, seed: int, max_steps: int, faults: int) -> RunOutcome:
    rng = random.Random(seed)
    plan = schedule(rng, faults, max_steps)
    out_dir = workdir / f"seed{seed}"
    sets = [*SMALL, f"run.max_steps={max_steps}", f"run.seed={seed}",
            f"run.output_dir={json.dumps(str(out_dir))}"]  # fmt: skip
    argv = [
        sys.executable,
        "-m",
        "astraflow.cli.main",
        "train",
        "recipes/quickstart.toml",
        "--no-live",
    ]
    for s in sets:
        argv += ["--set", s]
    run_dir = out_dir / "quickstart"
    log = open(workdir / f"seed{seed}.log", "w")
    started = time.time()
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    outcome = RunOutcome(seed, None, 0.0, plan)
    injector = threading.Thread(target=_inject, args=(run_dir, plan, proc, outcome), daemon=True)
    injector.start()
    try:
        proc.wait(timeout=240 + 10 * max_steps)  # a stuck run is a failed run
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the launcher stops its services in order
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    injector.join(timeout=30)
    log.close()
    outcome.returncode = proc.returncode
    outcome.wall_s = time.time() - started
    restarts = run_dir / "restarts.jsonl"
    if restarts.exists():
        outcome.restarts = sum('"restart"' in line for line in restarts.read_text().splitlines())
    outcome.steps_final, outcome.violations = check_invariants(run_dir, max_steps)
    if proc.returncode != 0:
        tail = (workdir / f"seed{seed}.log").read_text().splitlines()[-5:]
        outcome.violations.insert(0, f"run exited {proc.returncode}: {' | '.join(tail)}")
    return outcome


def summary(outcomes: list[RunOutcome]) -> dict:
    return {
        "runs": len(outcomes),
        "kills": sum(a.startswith("kill") for o in outcomes for a in o.applied),
        "stops": sum(a.startswith("stop") for o in outcomes for a in o.applied),
        "restarts": sum(o.restarts for o in outcomes),
        "runs_completed": sum(o.returncode == 0 for o in outcomes),
        "invariant_violations": sum(len(o.violations) for o in outcomes),
        "steps_final": [o.steps_final for o in outcomes],
        "violations": {str(o.seed): o.violations for o in outcomes if o.violations},
        "faults": {str(o.seed): o.applied for o in outcomes},
    }


#: the episode trial: tasks, episodes per task, turns per episode, and when node A is killed
EPISODE_TASKS, EPISODE_GROUP, EPISODE_TURNS = 6, 2, 6
#: first group (2 x 6 turns) done, the second group's episodes three or four turns in
KILL_AFTER_TURNS = EPISODE_GROUP * EPISODE_TURNS + 7


def _lines(path: Path) -> int:
    try:
        return len(path.read_text().splitlines())
    except OSError:
        return 0


def episode_trial(workdir: Path, checkpoint_after_s: float | None) -> dict:
    """Turns generated, turns trained and turns redone when a node dies mid-episode."""
    from astraflow.dataflow.storage import history

    workdir.mkdir(parents=True, exist_ok=True)
    node = [sys.executable, str(ROOT / "tests/rollout/scripted_node.py")]
    calls = {name: workdir / f"{name}.calls" for name in ("A", "B")}
    df = Dataflow(
        workdir / "df",
        multi_turn_recipe(
            workdir / "runs",
            "episodes",
            group=EPISODE_GROUP,
            n_tasks=EPISODE_TASKS,
            max_turns=EPISODE_TURNS,
            checkpoint_after_s=checkpoint_after_s,
        ),
    )
    procs = []
    try:
        a = start_node(workdir, df.url, "A", "--reply", "alpha", "--calls-log", str(calls["A"]),
                       runner=node)  # fmt: skip
        procs.append(a)
        wait_for("node A's turns", lambda: _lines(calls["A"]) >= KILL_AFTER_TURNS, every=0.01)
        a.signal(signal.SIGKILL)
        a.wait(10)
        b = start_node(workdir, df.url, "B", "--reply", "beta", "--calls-log", str(calls["B"]),
                       runner=node)  # fmt: skip
        procs.append(b)
        wait_for("every task done", lambda: df.status()["tasks_done"] == EPISODE_TASKS,
                 timeout=300, every=0.25)  # fmt: skip
        winners = {t.winner for t in df.read(history.tasks)}
        kept = [e for e in df.read(history.episodes) if e.lease_id in winners]
    finally:
        for p in reversed(procs):
            p.stop()
        df.stop()
    metrics = [e.info.get("metrics", {}) for e in kept]
    generated = _lines(calls["A"]) + _lines(calls["B"])
    trained = int(sum(m.get("turns", 0) for m in metrics))
    return {
        "checkpoint_after_s": checkpoint_after_s,
        "turns_generated": generated,
        "turns_trained": trained,
        "turns_redone": generated - trained,
        "killed_after_turns": _lines(calls["A"]),
        "episodes_resumed": sum(1 for m in metrics if m.get("resumed_turns", 0) > 0),
        "turns_resumed": int(sum(m.get("resumed_turns", 0) for m in metrics)),
    }


def episode_trials(workdir: Path, trials: int) -> dict:
    out: dict = {"episode_trials": [], "episode_turns_redone": {}}
    for mode, after in (("checkpoints", 0.0), ("no_checkpoints", None)):
        redone = []
        for i in range(trials):
            with console.status(f"episode trial {mode} {i + 1}/{trials}…"):
                trial = episode_trial(workdir / f"episodes-{mode}-{i}", after)
            out["episode_trials"].append({"mode": mode, **trial})
            redone.append(trial["turns_redone"])
        out["episode_turns_redone"][mode] = sum(redone) / len(redone)
    table = Table(title="episodes when a node dies mid-episode (turns)")
    for col in ("mode", "generated", "trained", "redone", "episodes resumed", "turns resumed"):
        table.add_column(col, justify="right")
    for t in out["episode_trials"]:
        table.add_row(t["mode"], *(str(t[k]) for k in ("turns_generated", "turns_trained",
                      "turns_redone", "episodes_resumed", "turns_resumed")))  # fmt: skip
    console.print(table)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 runs of 16 steps, 3 faults each")
    ap.add_argument("--runs", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None, help="max_steps per run")
    ap.add_argument("--faults", type=int, default=None, help="faults per run")
    ap.add_argument("--seed", type=int, default=0, help="first seed")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--keep", type=Path, default=None, help="keep the runs here")
    ap.add_argument(
        "--episodes-only", action="store_true", help="only the episode trial (no chaos runs)"
    )
    args = ap.parse_args()
    runs = args.runs or (2 if args.quick else 5)
    steps = args.steps or (16 if args.quick else 30)
    faults = args.faults or (3 if args.quick else 6)
    outcomes = []
    trials = 1 if args.quick else 3
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        workdir = args.keep.resolve() if args.keep else Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        episodes = episode_trials(workdir, trials)
        if args.episodes_only:
            if args.json:
                _stamp.write_json(args.json, episodes)
            return 0
        for i in range(runs):
            with console.status(f"chaos run {i + 1}/{runs} (seed {args.seed + i})…"):
                o = run_once(workdir, args.seed + i, steps, faults)
            state = "[green]ok[/]" if not o.violations else "[red]violations[/]"
            console.print(f"{state} seed {o.seed}: {o.wall_s:.0f}s, {'; '.join(o.applied)}")
            for v in o.violations:
                console.print(f"   [red]{v}[/]")
            outcomes.append(o)
    result = {**summary(outcomes), **episodes}
    table = Table(title=f"chaos: {runs} runs x {steps} steps, {faults} faults each")
    for col in ("runs", "kills", "stops", "restarts", "completed", "violations", "final versions"):
        table.add_column(col, justify="right")
    table.add_row(*(str(result[k]) for k in ("runs", "kills", "stops", "restarts",
                  "runs_completed", "invariant_violations")), str(result["steps_final"]))  # fmt: skip
    console.print(table)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        _stamp.write_json(args.json, result)
    return 0 if result["invariant_violations"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
