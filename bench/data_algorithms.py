"""What each data algorithm does to learning: every dataflow policy (and loss variant) against the
plain baseline, side by side, at equal trained samples.

Task set (mixed difficulty): generated arithmetic at levels 1, 2 and 3 plus level 4 (two-digit
products, which the tiny policy cannot solve yet), equal weights. Held-out accuracy: greedy, on the
level-2 test split, measured by the runs themselves (``evaluation.every_steps``). Level 2, the
learnable band and the held-out level, draws from its whole 20,000-problem train split; levels 1, 3
and 4 are capped at 64 problems each, so their prompts recur every few steps (the trivial and the
unsolvable items a run keeps meeting, which predictive skipping needs a history of). With level 2
capped at 64 problems too, the baseline memorised them and its held-out accuracy did not move in
120 steps (0.254 -> 0.226). Every system runs
the same recipe, seed and number of optimizer steps of the same size (so the same trained samples);
only ``[[dataflow.policies]]`` or the trainer's loss differ.

Per system (median and range over seeds): seconds and trained samples to a ladder of accuracies,
final accuracy, rollouts generated and wasted (zero-variance groups and stale drops), rollouts
skipped before generation, replayed samples. The headline ``speedup_to_baseline_final``: the
baseline's median seconds to its own median final accuracy divided by the system's (> 1: sooner;
None: the system never reached it, or the baseline's gain is within two standard errors of one
evaluation, i.e. it did not learn). ``speedup_equal_samples``: the baseline's median train time
divided by the system's, for the same trained samples.

Measured while setting it up: with every level capped at 64 problems, the baseline memorised its
64 level-2 problems and its held-out accuracy did not move in 48 or 120 steps, and "time to the
baseline's final accuracy" turned into a 1.9x "speed-up" from one lucky evaluation; with level 2
drawing from its whole split the same 48 steps take the baseline from 0.254 to 0.31 held out (3
seeds), well outside two standard errors.

    python bench/data_algorithms.py [--quick] [--json PATH] [--seeds 0,1,2] [--systems ...]

``--quick``: one seed, 10 steps, baseline and replay: a smoke run of the measurement (held-out
accuracy barely moves in 10 steps; rollout and waste counts do), two end-to-end trainings side by
side; ``--systems`` picks others. Full: three seeds, 48 steps, 8 systems, an evaluation of the
500-problem level-2 test split every 6 steps = 24 runs of about a minute each (~25 min on a quiet
2-core machine; `--systems` runs a subset). Times to an accuracy are interpolated between
evaluations.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cli import parse_systems  # noqa: E402
from _records import EvalPoint, read_jsonl, run_summary, step_records  # noqa: E402
from _report import console, fmt, print_failures, table, write_json  # noqa: E402
from _results import RunResult  # noqa: E402
from _runs import bench_workdir, run_logged, run_recipe  # noqa: E402
from _stats import censored_spread, ratio, spread, spread_json  # noqa: E402

BASE = """
[run]
name = "data-algorithms"
output_dir = "runs"
seed = 0
max_steps = {steps}

[policies.policy]
model = "builtin:tiny-arith"
engine = "transformers"
sampling = {{ temperature = 1.0, max_tokens = 12 }}
trainer = {{ loss_type = "{loss_type}", learning_rate = {lr}, groups_per_step = 16{trainer} }}

[tasks]
env = "astraflow/Math-v0"
group_size = 8
# the evaluation uses the first set's name and kwargs: level 2 held out
sets = [
  {{ name = "arith", kwargs = {{ level = 2 }}{d2} }},
  {{ name = "arith", kwargs = {{ level = 1 }}, limit = {limit}{d1} }},
  {{ name = "arith", kwargs = {{ level = 3 }}, limit = {limit}{d3} }},
  {{ name = "arith", kwargs = {{ level = 4 }}, limit = {limit}{d4} }},
]

[workflow]
name = "single_agent"
roles = {{ agent = "policy" }}

[dataflow]
max_lag = 2
policies = [
  {{ name = "zero_variance_filter" }},
  {{ name = "staleness", kwargs = {{ max_staleness = 2, action = "drop" }} }},
{policies}]

[rollout]
nodes = 1
concurrency = 256

[evaluation]
every_steps = {every}
split = "test"
num_tasks = {num_eval}
"""

#: system -> (extra dataflow policies as TOML inline tables, trainer overrides, set deadlines)
SYSTEMS: dict[str, dict[str, Any]] = {
    "baseline": {},
    "curriculum": {"policies": ['{ name = "curriculum", kwargs = { band = [0.15, 0.85] } }']},
    "predictive_skip": {"policies": ['{ name = "predictive_skip", kwargs = { p_max = 0.9 } }']},
    "replay": {"policies": ['{ name = "replay", kwargs = { ratio = 0.25, max_staleness = 2 } }']},
    # per-set deadlines: the held-out level first, the unsolvable level last and dropped if late
    "edf": {
        "policies": ['{ name = "edf", kwargs = { drop_expired = true } }'],
        "deadlines": {"d2": 15.0, "d1": 45.0, "d3": 45.0, "d4": 30.0},
    },
    "gspo": {"loss_type": "grpo", "trainer": ', importance_sampling_level = "sequence"'},
    "m2po": {"trainer": ', off_policy = "m2po"'},
    "curriculum+skip+replay": {
        "policies": [
            '{ name = "curriculum", kwargs = { band = [0.15, 0.85] } }',
            '{ name = "predictive_skip", kwargs = { p_max = 0.9 } }',
            '{ name = "replay", kwargs = { ratio = 0.25, max_staleness = 2 } }',
        ]
    },
}
QUICK_SYSTEMS = ["baseline", "replay"]
#: drop reasons that are rollouts generated and then thrown away
WASTE = ("zero_variance", "stale")


def recipe_text(
    system: str, *, steps: int, every: int, num_eval: int, limit: int, lr: float = 2e-4
) -> str:
    spec = SYSTEMS[system]
    deadlines = spec.get("deadlines", {})
    return BASE.format(
        steps=steps,
        lr=lr,
        every=every,
        num_eval=num_eval,
        limit=limit,
        loss_type=spec.get("loss_type", "dapo"),
        trainer=spec.get("trainer", ""),
        policies="".join(f"  {p},\n" for p in spec.get("policies", [])),
        **{k: (f", deadline_s = {deadlines[k]}" if k in deadlines else "") for k in DEADLINE_KEYS},
    )


DEADLINE_KEYS = ("d1", "d2", "d3", "d4")


def run_counts(records: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Drop reasons and policy counters of a finished run, summed over its policies, from the
    final status document in its ``run_summary`` record (``metrics.jsonl``)."""
    out: dict[str, dict[str, int]] = {"drops": {}, "counters": {}}
    summary = run_summary(records) or {}
    for policy in ((summary.get("status") or {}).get("policies") or {}).values():
        for key, field in (("drops", "dropped"), ("counters", "counters")):
            for name, n in (policy.get(field) or {}).items():
                out[key][name] = out[key].get(name, 0) + int(n)
    return out


def crossing_time(points: list[EvalPoint], threshold: float) -> float | None:
    """Seconds until held-out accuracy first reaches ``threshold``, interpolated linearly between
    the evaluation below it and the first one at or above it (None: never reached).

    Why interpolate: with one evaluation every few steps, "first evaluation at or above" rounds
    every time up to the next evaluation, so two systems a few steps apart read as equal and one
    evaluation later reads as 1.3x; the interpolated crossing keeps the difference that is there.
    """
    prev: EvalPoint | None = None
    for p in sorted(points, key=lambda p: (p.t, p.step)):
        if p.accuracy >= threshold - 1e-12:
            if prev is None:
                return p.t
            # prev is below the threshold and p at or above it, so p.accuracy > prev.accuracy
            frac = (threshold - prev.accuracy) / (p.accuracy - prev.accuracy)
            return prev.t + min(1.0, frac) * (p.t - prev.t)
        prev = p
    return None


def samples_at(records: list[dict[str, Any]]) -> dict[int, int]:
    """Cumulative trained samples after each step."""
    out, total = {}, 0
    for r in step_records(records, "policy"):
        total += int(r.get("samples") or 0)
        out[int(r["step"])] = total
    return out


def samples_to_accuracy(run: RunResult, samples: dict[int, int], level: float) -> int | None:
    pol = run.policies["policy"]
    for p in sorted(pol.evals, key=lambda p: (p.t, p.step)):
        if p.accuracy >= level - 1e-12:
            return samples.get(p.step, 0)
    return None


def learning_noise(acc: float, num_eval: int) -> float:
    """Two standard errors of one held-out evaluation of ``num_eval`` problems at accuracy ``acc``.

    Why: a baseline that gains less than this has not shown that it learned, and the time to its
    "final accuracy" is then the time to the first evaluation that happened to score as high
    (seen: every system "reached" a +1 point final at the first evaluation, a 1.9x "speedup").
    """
    return 2.0 * math.sqrt(max(acc * (1.0 - acc), 1e-9) / max(1, num_eval))


def analyse(runs: list[RunResult], systems: list[str], num_eval: int) -> dict[str, Any]:
    ok = {
        s: [r for r in runs if r.system == s and r.ok and "policy" in r.policies] for s in systems
    }
    base = ok.get("baseline", [])
    before = spread(r.policies["policy"].accuracy_before for r in base).median
    base_final = spread(r.policies["policy"].accuracy_final for r in base).median
    ladder = []
    noise = learning_noise(before, num_eval) if before is not None else None
    learned = (
        before is not None
        and base_final is not None
        and noise is not None
        and base_final - before > noise
    )
    if learned:
        n = 4
        ladder = [round(before + (base_final - before) * (i + 1) / n, 3) for i in range(n)]
    out: dict[str, Any] = {
        "baseline_final_acc": base_final,
        "acc_before": before,
        # False: the baseline's gain is within two standard errors of one evaluation, so no
        # time-to-accuracy (speedup_to_baseline_final, best_speedup) is computed
        "baseline_learned": learned,
        "eval_noise_2se": noise,
        "ladder": ladder,
        "systems": {},
    }
    base_t = None
    # no learning to time when the baseline ends no better than it started (a short, noisy run)
    if learned:
        base_t = censored_spread(
            [crossing_time(r.policies["policy"].evals, base_final) for r in base]
        ).median
    best = None
    for s in systems:
        rs = ok[s]
        recs = {id(r): read_jsonl(Path(r.run_dir) / "metrics.jsonl") for r in rs}
        counts = [run_counts(read_jsonl(Path(r.run_dir) / "metrics.jsonl")) for r in rs]
        t_final = None
        if base_t is not None:
            t_final = censored_spread(
                [crossing_time(r.policies["policy"].evals, base_final) for r in rs]
            ).median
        speedup = ratio(base_t, t_final) if rs else None
        if s != "baseline" and speedup is not None and (best is None or speedup > best):
            best = speedup
        rungs = {}
        for level in ladder:
            rungs[str(level)] = {
                "seconds": spread_json(
                    censored_spread([crossing_time(r.policies["policy"].evals, level) for r in rs])
                ),
                "samples": spread_json(
                    censored_spread(
                        [samples_to_accuracy(r, samples_at(recs[id(r)]), level) for r in rs]
                    )
                ),
            }
        out["systems"][s] = {
            "runs": len(rs),
            "final_acc": spread_json(spread(r.policies["policy"].accuracy_final for r in rs)),
            "seconds_to_baseline_final": t_final,
            "speedup_to_baseline_final": speedup,
            "train_s": spread_json(spread(r.policies["policy"].train_s for r in rs)),
            # the same trained samples in less time: robust even when held-out accuracy is flat
            "speedup_equal_samples": ratio(
                spread(r.policies["policy"].train_s for r in base).median,
                spread(r.policies["policy"].train_s for r in rs).median,
            )
            if rs and base
            else None,
            "trained_samples": spread_json(
                spread(r.policies["policy"].trained_samples for r in rs)
            ),
            "rollouts": spread_json(spread(r.policies["policy"].extra.get("episodes") for r in rs)),
            "wasted": spread_json(spread(sum(c["drops"].get(w, 0) for w in WASTE) for c in counts)),
            "wasted_by_reason": {
                w: spread_json(spread(c["drops"].get(w, 0) for c in counts))
                for w in (*WASTE, "deadline_expired")
            },
            "skipped": spread_json(
                spread(c["drops"].get("predicted_zero_variance", 0) for c in counts)
            ),
            "replayed_samples": spread_json(
                spread(c["counters"].get("replayed_samples", 0) for c in counts)
            ),
            "ladder": rungs,
        }
    out["best_speedup"] = best
    return out


def flat_keys(result: dict[str, Any]) -> dict[str, Any]:
    """The headline keys: ``<name>.speedup_to_baseline_final``, ``<name>.final_acc``,
    ``best_speedup``."""
    flat: dict[str, Any] = {"best_speedup": result["best_speedup"]}
    for s, d in result["systems"].items():
        flat[f"{s}.speedup_to_baseline_final"] = d["speedup_to_baseline_final"]
        flat[f"{s}.final_acc"] = d["final_acc"]["median"]
        flat[f"{s}.speedup_equal_samples"] = d["speedup_equal_samples"]
    return flat


def report(result: dict[str, Any], systems: list[str]) -> None:
    def sp(d: dict[str, Any], spec: str = "{:.0f}") -> str:
        if d["median"] is None:
            return "-"
        if d["n"] <= 1 or d["min"] == d["max"]:
            return spec.format(d["median"])
        hi = "never" if d["max"] is None else spec.format(d["max"])
        return f"{spec.format(d['median'])} [{fmt(d['min'], spec)}–{hi}]"

    rows = []
    for s in systems:
        d = result["systems"].get(s)
        if d is None:
            continue
        rows.append(
            [
                s,
                str(d["runs"]),
                sp(d["final_acc"], "{:.3f}"),
                fmt(d["seconds_to_baseline_final"], "{:.0f}", "s"),
                fmt(d["speedup_to_baseline_final"], "{:.2f}", "x"),
                sp(d["train_s"]),
                fmt(d["speedup_equal_samples"], "{:.2f}", "x"),
                sp(d["trained_samples"]),
                sp(d["rollouts"]),
                sp(d["wasted"]),
                sp(d["skipped"]),
                sp(d["replayed_samples"]),
            ]
        )
    title = (
        f"data algorithms vs baseline (held-out arith L2; baseline final "
        f"{fmt(result['baseline_final_acc'], '{:.3f}')}, before {fmt(result['acc_before'], '{:.3f}')})"
    )
    cols = ["system", "runs", "final acc", "t to base final", "speedup", "train s",
            "same samples", "trained samples", "rollouts", "wasted", "skipped", "replayed"]  # fmt: skip
    console.print(table(title, cols, rows))
    ladder = result["ladder"]
    if ladder:
        lrows = []
        for s in systems:
            d = result["systems"].get(s)
            if d is None:
                continue
            cells = []
            for level in ladder:
                rung = d["ladder"][str(level)]
                secs = sp(rung["seconds"])
                cells.append("never" if secs == "-" else f"{secs}s / {sp(rung['samples'])}")
            lrows.append([s, *cells])
        console.print(
            table(
                "seconds / trained samples to each accuracy (median [range]; - = never)",
                ["system", *(f"{lv:.3f}" for lv in ladder)],
                lrows,
            )
        )
    if not result["baseline_learned"]:
        console.print(
            f"[yellow]the baseline did not learn beyond noise[/] (before "
            f"{fmt(result['acc_before'], '{:.3f}')}, final {fmt(result['baseline_final_acc'], '{:.3f}')},"
            f" 2 SE of one evaluation {fmt(result['eval_noise_2se'], '{:.3f}')}): no time to its "
            "final accuracy is computed; compare the same-samples speedups"
        )
    console.print(
        f"best speedup to the baseline's final accuracy: {fmt(result['best_speedup'], '{:.2f}', 'x')}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 seed, 10 steps, baseline and replay")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--seeds", default=None, help="comma-separated seeds (default 0,1,2; quick 0)")
    ap.add_argument("--systems", default=None, help=f"subset of {', '.join(SYSTEMS)}")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--lr", type=float, default=2e-4, help="every system's learning rate")
    ap.add_argument("--workdir", type=Path, default=None, help="keep the runs here")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    args = ap.parse_args(argv)
    systems = (
        parse_systems(ap, args.systems, list(SYSTEMS))
        if args.systems
        else (QUICK_SYSTEMS if args.quick else list(SYSTEMS))
    )
    if "baseline" not in systems:
        systems = ["baseline", *systems]
    seeds = [int(s) for s in (args.seeds or ("0" if args.quick else "0,1,2")).split(",")]
    steps = args.steps or (10 if args.quick else 48)
    # full: eight evaluations of the whole level-2 test split (500 problems, SE ~0.02) per run
    every = max(1, steps // (4 if args.quick else 8))
    num_eval = 100 if args.quick else 500
    # small trivial/unsolvable sets so their prompts recur (predictive skipping needs a history)
    limit = 32 if args.quick else 64
    runs: list[RunResult] = []
    with bench_workdir(args.workdir, "af-data-algos-") as work:
        for seed in seeds:
            for s in systems:  # interleaved: machine load drifts hit every system alike
                recipe = work / f"{s.replace('+', '_')}.toml"
                recipe.write_text(
                    recipe_text(
                        s, steps=steps, every=every, num_eval=num_eval, limit=limit, lr=args.lr
                    )
                )
                runs.append(
                    run_logged(
                        f"{s} seed {seed}",
                        lambda recipe=recipe, s=s, seed=seed: run_recipe(
                            recipe,
                            [],
                            system=s.replace("+", "_"),
                            seed=seed,
                            workdir=work,
                            timeout_s=args.timeout,
                        ),  # fmt: skip
                        lambda p: f"final acc {fmt(p.accuracy_final if p else None, '{:.3f}')}",
                    )
                )
                runs[-1].system = s
        result = analyse(runs, systems, num_eval)
        report(result, systems)
        print_failures(
            runs,
            [
                "equal trained samples: every system takes the same steps of 16 groups x 8",
                "timings on a shared 2-core machine are noisy; see --seeds for spread",
            ],
        )
        if args.json:
            write_json(
                args.json,
                {
                    **flat_keys(result),
                    "quick": args.quick,
                    "seeds": seeds,
                    "steps": steps,
                    "result": result,
                    "runs": [r.to_json() for r in runs],
                },
            )
    return 0 if all(r.ok for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
