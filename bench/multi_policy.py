"""Two policies trained together: independent (async, default) versus lock-step (sync) dataflow.

``recipes/multi_policy_math.toml`` (a solver answers arithmetic, a verifier judges the answer; each
policy has its own trainer, buffer and version stream) runs twice through ``astraflow train``, once
in the default ``async`` mode and once with ``run.mode = sync`` (rounds: every policy's trainer
takes one step on the round's rollouts, and the next round starts only when all have), with the
same seed and the same number of optimizer steps, hence trained samples, per policy.

Reported per mode: training wall time (from training start to the last policy's last step; start-up
reported apart), the ratio sync/async (``speedup_sync_over_async``, target >= 1.6x), and per policy:
mean training reward at the start and the end, held-out accuracy at the end, and the trainer's idle
fraction (share of its training window spent waiting for a batch). A PNG plots reward and held-out
accuracy against wall time for both modes.

Where the time goes in sync mode: in each round the rollout node generates while both trainers wait,
then both trainers train (on 2 cores, side by side) while the node waits for the new weights, so
each trainer idles through every generation phase. In async mode the node keeps generating with
weights at most ``max_lag`` versions old while the trainers step, each as soon as its own batch is
ready.

    python bench/multi_policy.py --quick --json /tmp/multi_policy.json
"""

from __future__ import annotations

import json
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import _cli
import _evaluation
import _plots
import _records
import _report
import _results
import _runs
import _stats

RECIPE = _runs.REPO_ROOT / "recipes" / "multi_policy_math.toml"
MODES = ("sync", "async")

NOTES = [
    "The machine is shared (other jobs may be running): timings are noisy; repeat on an idle "
    "machine for publication numbers.",
    "Training wall time starts at the first weight version or rollout lease (whichever is first) "
    "and ends at the last optimizer step of any policy; start-up is reported apart.",
]


def run_mode(
    mode: str, seed: int, steps: int, eval_every: int, eval_tasks: int, workdir: Path,
    timeout_s: float, final_eval: _runs.FinalEval | None = None,
) -> _results.RunResult:  # fmt: skip
    overrides = [
        f"run.max_steps={steps}",
        f"run.mode={json.dumps(mode)}",
        f"run.name={json.dumps('multi-policy-' + mode)}",
        f"evaluation.every_steps={eval_every}",
        f"evaluation.num_tasks={eval_tasks}",
        "logging.report=false",
    ]
    return _runs.run_recipe(
        RECIPE, overrides, system=mode, seed=seed, workdir=workdir, timeout_s=timeout_s,
        final_eval=final_eval,
    )  # fmt: skip


def solver_final_eval(recipe, seed: int, eval_tasks: int) -> _runs.FinalEval:
    """Final held-out accuracy of the solver checkpoint when the run's own final evaluation did
    not complete: the solver's metric is its answer's correctness, i.e. greedy arithmetic accuracy
    with the solver's ``max_tokens``. The verifier's metric needs the solver's answers and is left
    marked as missing."""
    solver = recipe.workflow.roles.get("solver", "solver")
    settings = {
        "env": recipe.tasks.env,
        "env_kwargs": recipe.tasks.env_kwargs,
        "task_set": recipe.evaluation.task_set or recipe.tasks.sets[0].name,
        "eval_split": recipe.evaluation.split,
        "eval_tasks": eval_tasks,
        "max_tokens": recipe.evaluation.max_tokens or recipe.policies[solver].sampling.max_tokens,
    }
    return _evaluation.checkpoint_accuracy(settings, seed, policies=[solver])


def train_seconds(run: _results.RunResult) -> float | None:
    """Training start to the last step of the slowest policy."""
    times = [p.train_s for p in run.policies.values() if p.train_s is not None]
    return max(times) if times else None


def _policy_row(p: _results.PolicyResult) -> dict[str, Any]:
    return {
        "steps": p.steps,
        "trained_samples": p.trained_samples,
        "train_s": p.train_s,
        "samples_per_s": p.samples_per_s,
        "reward_first": p.reward_first,
        "reward_final": p.reward_final,
        "accuracy_before": p.accuracy_before,
        "accuracy_final": p.accuracy_final,
        "idle_fraction": p.idle_fraction,
        "idle_fraction_reported": p.extra.get("idle_fraction_reported"),
        "staleness_mean": p.extra.get("staleness_mean"),
        "final_eval_step": p.evals[-1].step if p.evals else None,
        "final_eval": p.extra.get("final_eval", "by the run"),
    }


def analyse(runs: dict[str, list[_results.RunResult]]) -> dict[str, Any]:
    """Per mode: the median over seeds of every figure (``*_spread``: median, min, max, n); the
    sync/async ratio is taken per seed (the two modes of one seed ran back to back) and its median
    reported."""
    modes: dict[str, Any] = {}
    for mode, seeds in runs.items():
        ok = [r for r in seeds if r.ok]
        names = sorted({n for r in ok for n in r.policies})
        policies = {}
        for name in names:
            rows = [_policy_row(r.policies[name]) for r in ok if name in r.policies]
            agg: dict[str, Any] = {"per_seed": rows}
            for key in ("steps", "trained_samples", "train_s", "samples_per_s", "reward_first",
                        "reward_final", "accuracy_before", "accuracy_final", "idle_fraction",
                        "idle_fraction_reported", "staleness_mean"):  # fmt: skip
                sp = _stats.spread(row[key] for row in rows)
                agg[key] = sp.median
                agg[f"{key}_spread"] = _stats.spread_json(sp)
            agg["final_eval"] = ", ".join(sorted({row["final_eval"] for row in rows}))
            agg["final_eval_step"] = rows[-1]["final_eval_step"] if rows else None
            policies[name] = agg
        modes[mode] = {
            "ok": len(ok) == len(seeds),
            "runs": len(seeds),
            "wall_s": _stats.spread(r.wall_s for r in ok).median,
            "startup_s": _stats.spread(r.startup_s for r in ok).median,
            "train_s": _stats.spread(train_seconds(r) for r in ok).median,
            "train_s_spread": _stats.spread_json(_stats.spread(train_seconds(r) for r in ok)),
            "policies": policies,
        }
    pairs = list(zip(runs.get("sync", []), runs.get("async", []), strict=False))
    per_seed = [_stats.ratio(train_seconds(a), train_seconds(b)) for a, b in pairs if a.ok and b.ok]
    wall = [_stats.ratio(a.wall_s, b.wall_s) for a, b in pairs if a.ok and b.ok]
    speedup = _stats.spread(per_seed)
    return {
        "modes": modes,
        "speedup_sync_over_async": speedup.median,
        "speedup_sync_over_async_spread": _stats.spread_json(speedup),
        "speedup_total_wall": _stats.spread(wall).median,
        "accuracy_final_async_minus_sync": {
            name: _diff(
                modes.get("async", {}).get("policies", {}).get(name, {}).get("accuracy_final"),
                modes.get("sync", {}).get("policies", {}).get(name, {}).get("accuracy_final"),
            )
            for name in sorted(modes.get("async", {}).get("policies", {}))
        },
    }


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def print_report(summary: dict[str, Any], runs: dict[str, list[_results.RunResult]]) -> None:
    rows = []
    for mode, m in summary["modes"].items():
        for name, p in m["policies"].items():
            rows.append(
                [
                    f"{mode} / {name}" + (f" ({m['runs']} seeds)" if m["runs"] > 1 else ""),
                    _report.fmt(m["wall_s"], "{:.0f}", "s"),
                    _report.fmt(m["startup_s"], "{:.0f}", "s"),
                    _report.fmt(m["train_s"], "{:.0f}", "s"),
                    f"{p['steps']} ({p['trained_samples']})",
                    _report.fmt(p["samples_per_s"], "{:.1f}"),
                    f"{_report.fmt(p['reward_first'], '{:.3f}')} → {_report.fmt(p['reward_final'], '{:.3f}')}",
                    f"{_report.fmt(p['accuracy_before'], '{:.3f}')} → "
                    f"{_report.fmt(p['accuracy_final'], '{:.3f}')}{_eval_mark(p)}",
                    _report.fmt(p["idle_fraction"], "{:.2f}"),
                    _report.fmt(p["staleness_mean"], "{:.2f}"),
                ]
            )
    _report.console.print(
        _report.table(
            "Multi-policy (solver + verifier): sync vs async dataflow",
            [
                "mode / policy",
                "wall",
                "startup",
                "train",
                "steps (samples)",
                "samples/s",
                "reward start → end",
                "held-out acc",
                "trainer idle",
                "staleness",
            ],
            rows,
        )  # fmt: skip
    )
    _report.console.print(
        "training wall time sync / async (median of per-seed ratios): "
        f"[bold]{_report.fmt(summary['speedup_sync_over_async'], '{:.2f}', 'x')}[/] (target >= 1.6x); "
        f"total wall incl. start-up: {_report.fmt(summary['speedup_total_wall'], '{:.2f}', 'x')}"
    )
    _report.console.print(
        "held-out acc marks: * = the run's own final evaluation did not complete and the bench "
        "evaluated the final checkpoint (same problems, greedy, Math env scoring); "
        "@k = last evaluation that completed was at step k."
    )
    diffs = summary["accuracy_final_async_minus_sync"]
    _report.console.print(
        "final held-out accuracy, async - sync (median over seeds): "
        + ", ".join(f"{name} {_report.fmt(d, '{:+.3f}')}" for name, d in diffs.items())
    )
    for mode, seeds in runs.items():
        for run in seeds:
            if not run.ok:
                _report.console.print(f"[red]{mode} seed {run.seed} failed:[/] {run.error}")
    for note in NOTES:
        _report.console.print(f"[dim]- {note}[/]")


def _eval_mark(p: dict[str, Any]) -> str:
    if p["final_eval"] == "by the bench":
        return "*"
    if p["final_eval"] == "missing":
        return f" @{p['final_eval_step']}"
    return ""


def plot(runs: dict[str, _results.RunResult], path: Path) -> Path | None:
    """Reward (per step) and held-out accuracy (per evaluation) against training wall time (one
    seed: curves of several seeds on one axis are unreadable)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_r, ax_a) = plt.subplots(1, 2, figsize=(11, 4))
    styles = {"sync": "--", "async": "-"}
    drawn = False
    for mode, run in runs.items():
        if run.run_dir is None:
            continue
        records = _records.read_jsonl(Path(run.run_dir) / "metrics.jsonl")
        for name, p in sorted(run.policies.items()):
            pts = [
                (float(r["time"]) - run.t0, float(r["reward_mean"]))
                for r in _records.step_records(records, name)
                if r.get("reward_mean") is not None and "time" in r and run.t0 is not None
            ]
            if pts:
                ax_r.plot(*zip(*pts, strict=True), styles.get(mode, "-"), label=f"{mode} {name}")
                drawn = True
            if p.evals:
                ax_a.plot(
                    [e.t for e in p.evals],
                    [e.accuracy for e in p.evals],
                    styles.get(mode, "-"),
                    marker="o",
                    label=f"{mode} {name}",
                )
                drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax_r.set_title("training reward (mean of the step's groups)")
    ax_a.set_title("held-out accuracy (greedy)")
    for ax in (ax_r, ax_a):
        ax.set_xlabel("seconds since training start")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _plots.save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    ap = _cli.bench_parser(__doc__)
    _cli.add_output_flags(ap, quick="few steps (about 2 minutes)")
    _cli.add_run_flags(ap, seeds_default=1)
    ap.add_argument("--seed", type=int, default=0, help="first seed")
    ns = ap.parse_args(argv)

    from astraflow.recipe import load_recipe

    recipe = load_recipe(RECIPE)
    steps = ns.steps or (12 if ns.quick else recipe.run.max_steps)
    eval_every = ns.eval_every or (6 if ns.quick else 10)
    eval_tasks = ns.eval_tasks or (50 if ns.quick else recipe.evaluation.num_tasks)
    timeout = ns.timeout or (300.0 if ns.quick else 1800.0)
    workdir = ns.workdir or (
        _runs.REPO_ROOT / "runs" / "bench" / time.strftime("multi_policy-%Y%m%d-%H%M%S")
    )
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    plot_path = ns.plot or workdir / "multi_policy.png"

    runs: dict[str, list[_results.RunResult]] = {mode: [] for mode in MODES}
    n_seeds = ns.seeds or 1
    for seed in range(ns.seed, ns.seed + n_seeds):
        for mode in MODES:
            label = f"{mode} mode, seed {seed}, {steps} steps per policy"
            job = partial(
                run_mode, mode, seed, steps, eval_every, eval_tasks, workdir, timeout,
                solver_final_eval(recipe, seed, eval_tasks),
            )  # fmt: skip
            runs[mode].append(_runs.run_logged(label, job, None))
    summary = analyse(runs)
    print_report(summary, runs)
    written = _plots.plot_safely(
        lambda: plot({mode: seeds[0] for mode, seeds in runs.items() if seeds}, plot_path)
    )
    if ns.json:
        payload = {
            "benchmark": "multi_policy",
            "quick": ns.quick,
            "settings": {
                "recipe": str(RECIPE.relative_to(_runs.REPO_ROOT)),
                "seeds": list(range(ns.seed, ns.seed + n_seeds)),
                "steps_per_policy": steps,
                "eval_every": eval_every,
                "eval_tasks": eval_tasks,
                "workdir": str(workdir),
            },
            **summary,
            "plot": str(written) if written else None,
            "notes": NOTES,
            "runs": {m: [r.to_json() for r in seeds] for m, seeds in runs.items()},
        }
        _report.write_json(ns.json, payload)
        _report.console.print(f"wrote {ns.json}")
    return 0 if all(r.ok for seeds in runs.values() for r in seeds) else 1


if __name__ == "__main__":
    sys.exit(main())
