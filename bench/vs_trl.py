"""AstraFlow versus TRL's stock ``GRPOTrainer``: time to reach a held-out accuracy on a 2-core CPU.

Three systems train the same starter policy (``builtin:tiny-arith``) on the same task stream
(``astraflow.tasks.arith`` train split, in loader order), with the same reward (the Math env's grading,
``astraflow.envs.math``), sampling (temperature 1.0, top-p 1, no top-k, ``max_tokens`` of the quickstart),
group size, groups per step, loss (DAPO, beta 0), learning rate (constant) and number of optimizer
steps, hence the same number of trained samples:

* ``trl``: ``trl.GRPOTrainer`` generating inside the trainer (transformers ``generate``), in one
  process with 2 torch threads: it runs alone, so it gets both cores;
* ``astraflow_async``: ``astraflow train recipes/quickstart.toml`` (dataflow service, one rollout
  node and one trainer, 1 torch thread each), the default asynchronous dataflow;
* ``astraflow_sync``: the same with ``run.mode = sync`` (lock-step rounds: generate, then train);
* ``trl_1thread``: TRL again with 1 torch thread. Not a contender: it measures how much each phase
  gains from the second core, which sets the best any two-stage pipeline (one core generating, one
  training, no overhead) can do against TRL on this machine:
  ``pipeline_bound = TRL step (2 threads) / max(generate step, train step) (1 thread each)``.

Data treatment: TRL trains on every group it generates, including groups whose rewards are all
equal (zero advantage). The quickstart recipe drops those (``zero_variance_filter``, DAPO's dynamic
sampling), which changes the algorithm and makes the rollout node generate ~1.7x more episodes per
trained sample. So the AstraFlow runs here use TRL's treatment: the recipe's dataflow policies
without ``zero_variance_filter`` (``--keep-filters`` keeps the recipe's own).

Held-out accuracy: greedy decoding on the first N problems of the arith test split, scored by the
Math env, every k optimizer steps and at step 0. AstraFlow evaluates on its rollout node while
training goes on (the evaluation competes with training for the 2 cores, which counts against
AstraFlow); TRL evaluates in a callback that pauses training, and that pause is *excluded* from
TRL's clock. Both choices favour TRL, so the measured speed-up is conservative.

Clocks: every system is timed from its training start (``_records`` docstring); start-up (imports,
model loading, spawning services) is reported apart. Time to accuracy = time at which the weights
that first scored >= the threshold existed. The threshold is the lowest median final accuracy among
the systems (every system reaches it in a typical run), unless ``--threshold`` is given.

Measured: with the recipe's ``zero_variance_filter`` the node generates ~1.7x more episodes per
trained sample (DAPO's dynamic sampling), hence the filter is off unless ``--keep-filters``.

    python bench/vs_trl.py --quick --json /tmp/vs_trl.json
    python bench/vs_trl.py --seeds 3 --json /tmp/vs_trl.json
"""

from __future__ import annotations

import argparse
import json
import sys
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
import _trl as T

QUICKSTART = _runs.REPO_ROOT / "recipes" / "quickstart.toml"
SYSTEMS = ("trl", "trl_1thread", "astraflow_async", "astraflow_sync")

NOTES = [
    "Why not 2x: with generation and training perfectly overlapped, a pipeline can at best hide the "
    "shorter of the two phases, so the bound over a serial generate-then-train loop is 2x only when "
    "both take equal time; with TRL's measured generation share g it is 1 / (1 - g) (printed as the "
    "overlap bound), and only if the overlapped phases run as fast as in TRL. On a 2-core machine "
    "they do not: the rollout node and the trainer get one core each instead of TRL's two (the "
    "pipeline bound, printed, measures that limit directly from TRL's 1- and 2-thread phase "
    "times), and weight publication, weight loading on the node, HTTP/msgpack transfer and the "
    "dataflow service's SQLite writes take CPU from the same 2 cores.",
    "Fairness: both systems are evaluated by this bench with the same greedy code, off their "
    "clocks (TRL in a callback whose pauses are excluded, AstraFlow on the weight versions it "
    "published, placed at the time each was committed); --online-eval makes AstraFlow evaluate "
    "itself on its node while training, on its clock. AstraFlow trains on TRL's kind of batches "
    "(no zero-variance filter; --keep-filters for the recipe's). TRL gets 2 torch threads (it "
    "runs alone), AstraFlow's services 1 each.",
    "The headline threshold is near the plateau, where one noisy evaluation decides; the ladder "
    "table gives the same race at every 0.01 of accuracy.",
    "The machine may be shared: timings are noisy; compare medians over seeds.",
]


# ----------------------------------------------------------------------------- settings


def quickstart_settings() -> dict[str, Any]:
    """The comparison's shared hyper-parameters, read from the quickstart recipe itself."""
    from astraflow.recipe import load_recipe

    recipe = load_recipe(QUICKSTART)
    return T.grpo_settings(recipe) | {
        "eval_every": recipe.evaluation.every_steps,
        "eval_tasks": recipe.evaluation.num_tasks,
    }


def trl_data_treatment() -> str:
    """Recipe override: the quickstart's dataflow policies minus the zero-variance filter, so
    AstraFlow trains on the same kind of groups as TRL (all of them, zero advantage included)."""
    from astraflow.recipe import load_recipe

    kept = [
        {"name": p.name, "kwargs": p.kwargs}
        for p in load_recipe(QUICKSTART).dataflow.policies
        if p.name != "zero_variance_filter"
    ]
    return f"dataflow.policies={_toml_inline(kept)}"


def _toml_inline(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml_inline(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_toml_inline(v) for v in value) + "]"
    return json.dumps(value)


# ----------------------------------------------------------------------------- TRL worker


def trl_worker(ns: argparse.Namespace) -> None:
    """Train with stock ``trl.GRPOTrainer``; write metrics in AstraFlow's metrics.jsonl format.

    Runs in its own process (spawned by :func:`run_trl`) so that its threads, memory and start-up
    are measured exactly like an ``astraflow train`` subprocess. The reward is the recipe env's
    grading of the single answer (astraflow/Math-v0).
    """
    w = T.Worker.start(ns)
    score = w.score or _evaluation.env_scorer(w.cfg["env"], w.cfg["env_kwargs"])

    def math_env_reward(prompts, completions, answer, **_: Any) -> list[float]:
        rewards = []
        for prompt, completion, gold in zip(prompts, completions, answer, strict=True):
            question = prompt[-1]["content"] if isinstance(prompt, list) else str(prompt)
            text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
            rewards.append(score(question, gold, text))
        return rewards

    rows = [
        {"prompt": [{"role": "user", "content": p["question"]}], "answer": p["answer"]}
        for p in w.train_tasks
    ]
    w.train(rows, [math_env_reward])


def run_trl(
    seed: int, steps: int, eval_every: int, eval_tasks: int, threads: int, workdir: Path,
    timeout_s: float, settings: dict[str, Any], system: str = "trl",
) -> _results.RunResult:  # fmt: skip
    return T.run_worker(
        Path(__file__), system, seed, steps, eval_every, eval_tasks, threads,
        workdir / f"{system}-s{seed}", workdir / f"{system}-s{seed}.log", timeout_s, settings,
    )  # fmt: skip


def run_astraflow(
    mode: str, seed: int, steps: int, eval_every: int, eval_tasks: int, workdir: Path,
    timeout_s: float, extra: list[str] | None = None, final_eval: _runs.FinalEval | None = None,
    settings: dict[str, Any] | None = None,
) -> _results.RunResult:  # fmt: skip
    """One AstraFlow run. With ``settings`` (the default), the held-out evaluation is done like
    TRL's: by this bench, off the run's clock, with the same greedy code, on the weight versions
    the run published (kept in its store for the purpose); without, the run evaluates itself on
    its rollout node while training goes on."""
    offline = settings is not None
    overrides = [
        f"run.max_steps={steps}",
        f"run.mode={json.dumps(mode)}",
        f"run.name={json.dumps('vs-trl-' + mode)}",
        f"evaluation.every_steps={0 if offline else eval_every}",
        f"evaluation.num_tasks={eval_tasks}",
        "logging.report=false",
        *([f"policies.policy.trainer.keep_versions={steps + 1}"] if offline else []),
        *(extra or []),
    ]
    result = _runs.run_recipe(
        QUICKSTART,
        overrides,
        system=f"astraflow_{mode}",
        seed=seed,
        workdir=workdir,
        timeout_s=timeout_s,
        final_eval=None if offline else final_eval,
        eval_grace_s=0.0 if offline else 30.0,
    )
    if offline and result.ok and "policy" in result.policies:
        res = result.policies["policy"]
        res.evals = published_version_evals(result, settings, seed, eval_every, steps)
        res.extra["final_eval"] = "by the bench (published versions)"
    return result


def published_version_evals(
    run: _results.RunResult, settings: dict[str, Any], seed: int, every: int, steps: int
) -> list[_records.EvalPoint]:
    """Held-out accuracy (:func:`_evaluation.accuracy_function`) of versions 0, every, 2*every,
    ..., steps, read from the run's
    weight store, each placed at the time its step was committed (version 0 at training start)."""
    import torch
    from astraflow.tasks.catalog import load_task_set
    from transformers import AutoModelForCausalLM

    from astraflow.models import load_tokenizer, resolve_model

    run_dir = Path(run.run_dir or "")
    records = _records.read_jsonl(run_dir / "metrics.jsonl")
    times = _records.step_times(records, "policy")
    path = resolve_model(settings["model"])
    tokenizer = load_tokenizer(path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    problems = load_task_set(
        settings["task_set"], settings["eval_split"], seed=seed, limit=settings["eval_tasks"]
    )
    score = _evaluation.env_scorer(settings["env"], settings["env_kwargs"])
    accuracy = _evaluation.accuracy_function(settings)  # greedy math, or tool episodes
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the run is over: the bench has the machine
    points = []
    try:
        for step in sorted({*range(0, steps + 1, every), steps}):
            if (step and step not in times) or not _evaluation.load_published(
                model, run_dir, "policy", step
            ):
                _report.console.print(f"[yellow]version {step} not in the store: left out[/]")
                continue
            acc = accuracy(model, tokenizer, problems, settings["max_tokens"], score)
            t = 0.0 if step == 0 else max(0.0, times[step] - float(run.t0 or 0.0))
            points.append(_records.EvalPoint(step, t, acc))
    finally:
        torch.set_num_threads(threads)
    return points


# ----------------------------------------------------------------------------- analysis


def analyse(runs: list[_results.RunResult], threshold_arg: float | None) -> dict[str, Any]:
    ok = _results.successful_runs(runs, SYSTEMS)
    by_system = {s: [r.policies["policy"] for r in rs] for s, rs in ok.items()}
    before = _stats.spread(p.accuracy_before for ps in by_system.values() for p in ps).median
    if threshold_arg is not None:
        threshold, how = threshold_arg, "given with --threshold"
    else:
        threshold = _stats.choose_threshold(
            {s: [p.accuracy_final for p in ps] for s, ps in by_system.items() if ps}, before
        )
        how = "lowest median final held-out accuracy among the systems"
    systems: dict[str, Any] = {}
    for s, ps in by_system.items():
        tta = [_records.time_to_accuracy(p.evals, threshold) if threshold else None for p in ps]
        systems[s] = {
            **_results.throughput_json(ok[s], startup=True),
            "accuracy_before": _stats.spread_json(_stats.spread(p.accuracy_before for p in ps)),
            "accuracy_final": _stats.spread_json(_stats.spread(p.accuracy_final for p in ps)),
            "accuracy_best": _stats.spread_json(_stats.spread(p.accuracy_best for p in ps)),
            "time_to_acc_s": _stats.spread_json(_stats.censored_spread(tta)),
            "time_to_acc_reached": sum(t is not None for t in tta),
            "trainer_idle_fraction": _stats.spread_json(_stats.spread(p.idle_fraction for p in ps)),
            "trainer_idle_fraction_reported": _stats.spread_json(
                _stats.spread(p.extra.get("idle_fraction_reported") for p in ps)
            ),
            "episodes": _stats.spread_json(_stats.spread(p.extra.get("episodes") for p in ps)),
            "generate_s_per_step": _stats.spread_json(
                _stats.spread(p.extra.get("generate_s_per_step") for p in ps)
            ),
            "optimize_s_per_step": _stats.spread_json(
                _stats.spread(p.extra.get("optimize_s_per_step") for p in ps)
            ),
            "final_eval_by_bench": sum(p.extra.get("final_eval") == "by the bench" for p in ps),
            "final_eval_missing": sum(p.extra.get("final_eval") == "missing" for p in ps),
        }
    tta_med = {s: systems[s]["time_to_acc_s"]["median"] for s in systems}
    # The headline threshold sits near the plateau, where one noisy evaluation decides; the ladder
    # shows the same race at every 0.01 of accuracy between the start and the threshold.
    ladder = {
        f"{level:.2f}": {
            s: _stats.censored_spread(
                [_records.time_to_accuracy(p.evals, level) for p in ps]
            ).median
            for s, ps in by_system.items()
        }
        for level in _stats.accuracy_levels(before, threshold or None)
    }
    return {
        "threshold": threshold,
        "threshold_rule": how,
        "time_to_acc_ladder": ladder,
        "accuracy_before": before,
        "systems": systems,
        "speedup_time_to_acc": _stats.ratio(tta_med.get("trl"), tta_med.get("astraflow_async")),
        "speedup_time_to_acc_sync": _stats.ratio(tta_med.get("trl"), tta_med.get("astraflow_sync")),
        "speedup_async_over_sync": _stats.ratio(
            tta_med.get("astraflow_sync"), tta_med.get("astraflow_async")
        ),
        # Amdahl bound of overlapping generation with training, from TRL's own phase split:
        # hiding TRL's generation share g completely speeds a step up by at most 1 / (1 - g).
        "overlap_bound_vs_trl": _overlap_bound(systems.get("trl", {})),
        "pipeline_bound_vs_trl": _pipeline_bound(systems.get("trl"), systems.get("trl_1thread")),
        "speedup_samples_per_s": _stats.ratio(
            systems.get("astraflow_async", {}).get("samples_per_s", {}).get("median"),
            systems.get("trl", {}).get("samples_per_s", {}).get("median"),
        ),
    }


def _overlap_bound(trl: dict[str, Any]) -> float | None:
    share = (trl.get("trainer_idle_fraction") or {}).get("median")
    return None if share is None or share >= 1 else 1.0 / (1.0 - share)


def _pipeline_bound(two: dict[str, Any] | None, one: dict[str, Any] | None) -> float | None:
    """TRL's step on 2 threads over the slower phase on 1 thread: the most a pipeline that gives
    each phase one core can gain here, before any of its own costs (transfer, weight sync, eval)."""
    if not two or not one:
        return None
    med = lambda d, k: (d.get(k) or {}).get("median")  # noqa: E731
    parts = [med(two, "generate_s_per_step"), med(two, "optimize_s_per_step")]
    slow = [med(one, "generate_s_per_step"), med(one, "optimize_s_per_step")]
    if None in parts or None in slow or max(slow) <= 0:
        return None
    return (parts[0] + parts[1]) / max(slow)


def print_report(summary: dict[str, Any], runs: list[_results.RunResult]) -> None:
    sp = _report.spread_text
    rows = []
    for s, d in summary["systems"].items():
        rows.append(
            [
                s,
                str(d["runs"]),
                sp(d["wall_s"], "{:.0f}", "s"),
                sp(d["startup_s"], "{:.0f}", "s"),
                sp(d["train_s"], "{:.0f}", "s"),
                sp(d["samples_per_s"], "{:.1f}"),
                sp(d["accuracy_before"], "{:.3f}"),
                sp(d["accuracy_final"], "{:.3f}"),
                sp(d["time_to_acc_s"], "{:.0f}", "s")
                + f" ({d['time_to_acc_reached']}/{d['runs']})",
                sp(d["trainer_idle_fraction"], "{:.2f}"),
            ]
        )
    thr = summary["threshold"]
    _report.console.print(
        _report.table(
            f"AstraFlow vs TRL GRPOTrainer (median and min–max over seeds; "
            f"threshold {_report.fmt(thr, '{:.3f}')}: {summary['threshold_rule']})",
            [
                "system",
                "runs",
                "wall",
                "startup",
                "train",
                "samples/s",
                "acc before",
                "acc final",
                "time to acc",
                "trainer idle",
            ],
            rows,
        )  # fmt: skip
    )
    _report.console.print(
        f"speed-up in time to accuracy, TRL / AstraFlow async: "
        f"[bold]{_report.fmt(summary['speedup_time_to_acc'], '{:.2f}', 'x')}[/] (target >= 1.5x); "
        f"TRL / AstraFlow sync: {_report.fmt(summary['speedup_time_to_acc_sync'], '{:.2f}', 'x')}; "
        f"sync / async: {_report.fmt(summary['speedup_async_over_sync'], '{:.2f}', 'x')}"
    )
    _report.console.print(
        "overlap bound: TRL spends "
        f"{_report.fmt(summary['systems'].get('trl', {}).get('trainer_idle_fraction', {}).get('median'), '{:.0%}')}"
        " of its training time generating, so a pipeline that hid all of it with an equally fast "
        f"trainer would be {_report.fmt(summary['overlap_bound_vs_trl'], '{:.2f}', 'x')} faster "
        "(the 2x bound needs generation = 50% of the step)"
    )
    trl2, trl1 = summary["systems"].get("trl"), summary["systems"].get("trl_1thread")
    if trl2 and trl1:
        per = lambda d, k: _report.fmt((d.get(k) or {}).get("median"), "{:.3f}", "s")  # noqa: E731
        _report.console.print(
            f"phases per step, TRL 2 threads: generate {per(trl2, 'generate_s_per_step')}, "
            f"optimize {per(trl2, 'optimize_s_per_step')}; 1 thread: generate "
            f"{per(trl1, 'generate_s_per_step')}, optimize {per(trl1, 'optimize_s_per_step')} -> "
            "pipeline bound on this machine (one core per phase, zero overhead): "
            f"[bold]{_report.fmt(summary['pipeline_bound_vs_trl'], '{:.2f}', 'x')}[/]"
        )
    _report.console.print(
        "trainer idle: AstraFlow = share of the training window the trainer waited for a batch; "
        "TRL = share of training time spent generating and scoring (not optimizing)."
    )
    _report.print_ladder(
        "median seconds to reach each held-out accuracy (censored: '-' = not reached by half the "
        "seeds)",
        list(summary["systems"]),
        summary.get("time_to_acc_ladder") or {},
    )
    for s, d in summary["systems"].items():
        if d["final_eval_by_bench"] or d["final_eval_missing"]:
            _report.console.print(
                f"[yellow]{s}: the run's own evaluation of its final step did not complete in "
                f"{d['final_eval_by_bench'] + d['final_eval_missing']} of {d['runs']} run(s); the "
                f"bench evaluated the final checkpoint itself in {d['final_eval_by_bench']} "
                "(same greedy decoding, problems and scoring)[/]"
            )
    _report.print_failures(runs, NOTES)


def plot(runs: list[_results.RunResult], path: Path) -> Path | None:
    """Held-out accuracy against training time, one line per run, one colour per system."""
    colours = dict(zip(SYSTEMS, ("tab:blue", "tab:gray", "tab:red", "tab:orange"), strict=True))
    return _plots.plot_accuracy(
        runs, path, colours, "AstraFlow vs TRL GRPOTrainer, one line per seed",
        "seconds since training start (evaluation pauses excluded)",
    )  # fmt: skip


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = _cli.bench_parser(__doc__)
    _cli.add_output_flags(ap, quick="1 seed, few steps (about 2 minutes)")
    _cli.add_run_flags(ap)
    _cli.add_comparison_flags(ap, SYSTEMS)
    ap.add_argument("--threshold", type=float, default=None, help="fixed accuracy to time")
    ap.add_argument(
        "--online-eval",
        action="store_true",
        help="AstraFlow evaluates itself on its rollout node during training (on its clock)",
    )
    ap.add_argument(
        "--keep-filters",
        action="store_true",
        help="AstraFlow keeps the recipe's zero-variance filter (TRL has none)",
    )
    # internal: the TRL run itself, in a subprocess
    T.add_worker_args(ap)
    ns = ap.parse_args(argv)
    if ns.trl_worker:
        trl_worker(ns)
        return 0

    settings = quickstart_settings()
    seeds = ns.seeds or (1 if ns.quick else 3)
    steps = ns.steps or (8 if ns.quick else settings["max_steps"])
    eval_every = ns.eval_every or (4 if ns.quick else 10)
    eval_tasks = ns.eval_tasks or (100 if ns.quick else settings["eval_tasks"])
    timeout = ns.timeout or (240.0 if ns.quick else 1800.0)
    systems = _cli.parse_systems(ap, ns.systems, SYSTEMS)
    settings.update(max_steps=steps, eval_every=eval_every, eval_tasks=eval_tasks, seeds=seeds)
    af_set = ([] if ns.keep_filters else [trl_data_treatment()]) + list(ns.af_set)
    settings["astraflow_extra_overrides"] = af_set

    runs: list[_results.RunResult] = []
    if ns.from_json:
        saved = json.loads(ns.from_json.read_text())
        runs = [_results.RunResult.from_json(r) for r in saved["runs"]]
        settings = saved["settings"]
        seeds = 0  # nothing to run
    with _runs.bench_workdir(ns.workdir, "astraflow-vs-trl-") as workdir:
        for seed in range(seeds):
            for system in systems:
                if system.startswith("trl"):
                    threads = 1 if system == "trl_1thread" else ns.trl_threads
                    run = partial(
                        run_trl, seed, steps, eval_every, eval_tasks, threads, workdir, timeout,
                        settings, system,
                    )  # fmt: skip
                else:
                    run = partial(
                        run_astraflow, system.removeprefix("astraflow_"), seed, steps,
                        eval_every, eval_tasks, workdir, timeout, af_set,
                        _evaluation.checkpoint_accuracy(settings, seed),
                        None if ns.online_eval else settings,
                    )  # fmt: skip
                label = f"{system} seed {seed} ({steps} steps, eval every {eval_every})"
                runs.append(_runs.run_logged(label, run, _final_accuracy))
        summary = analyse(runs, ns.threshold)
        print_report(summary, runs)
        plotted = _plots.plot_safely(lambda: plot(runs, ns.plot)) if ns.plot else None
        if ns.json:
            payload = {
                "benchmark": "vs_trl",
                "quick": ns.quick,
                "settings": settings
                | ({} if ns.from_json else {"trl_threads": ns.trl_threads, "astraflow_threads": 1}),
                **summary,
                "notes": NOTES,
                "plot": str(plotted) if plotted else None,
                "runs": [r.to_json() for r in runs],
            }
            _report.write_json(ns.json, payload)
            _report.console.print(f"wrote {ns.json}")
    return 0 if all(r.ok for r in runs) else 1


def _final_accuracy(pol: _results.PolicyResult | None) -> str:
    return f"final accuracy {_report.fmt(pol.accuracy_final if pol else None, '{:.3f}')}"


if __name__ == "__main__":
    sys.exit(main())
