"""Multi-policy agentic training: AstraFlow's asynchronous dataflow against its own lock-step mode.

``recipes/multi_policy_agentic.toml``: a solver works through ``astraflow/MathMultiTurn-v0`` (up to
3 tries with "incorrect, try again" feedback, every answer checked by a tool), and a verifier judges
the solver's last answer, its verdict checked by a tool of its own (``verifier_tool_env``). Both
tools are I/O-bound and long-tailed (``[tasks.env_latency]``: log-normal, median 0.3 s, p99 5 s).
Each policy trains on its own rewards with its own trainer, buffer and version clock.

Two systems, the same recipe, models, tasks, rewards, sampling, learning rates and trained samples
per policy (the same steps of the same batch size), seeds paired:

* ``astraflow_sync``: ``run.mode = sync``, rounds as a colocated synchronous system runs them: the
  round's episodes all roll out (so the round waits for its slowest tool calls), then both policies
  train, then the next round starts on the new weights.
* ``astraflow_async``: the default dataflow: hundreds of episodes in flight on the node, most of them
  waiting on a tool, while each trainer trains on what has come back for its policy.

Held-out accuracy is measured by the bench off both systems' clocks, on the weight versions each
run published (versions 0, every k steps and the last, each placed at the time its step was
committed): the solver's greedy first answer on the arith test split (scored by the env), the
verifier's greedy verdict on the same step's solver answers (scored by its check tool, as in
training). Reported per system: time to each policy's lock-step final accuracy (the median over
seeds of the sync runs' final accuracy of that policy, one level for both systems and every seed),
per-policy final accuracy, samples/s, trainer idle, episodes in flight (mean/max over the training
window), and the straggler bound of the latency distribution (what a lock-step round waits for its
slowest episode's tool calls). Headline ``speedup_time_to_acc``: per policy, sync's median time to
that level over async's (censored: a seed that never reaches it ranks last), the slower policy's
ratio (the smaller); ``speedup_time_to_acc_paired``: per seed, the time until *both* policies
reached their levels (geometric mean of the ratios, 95 % interval), ``speedup_time_to_acc_both``
the ratio of those times' censored medians; and
``speedup_time_to_own_seed_target``: the same race to each seed's own lock-step final accuracy.
JSON per system: ``<system>.solver.final_acc``, ``<system>.verifier.final_acc``,
``<system>.samples_per_s``, ``<system>.trainer_idle``, ``<system>.episodes_in_flight``.

Measured while setting the recipe (pilot runs on a shared 2-core machine; the bench's own figures
are in docs/results.md). Verifier warm-up (``warmup_steps = 4``): without it, one async seed's first
batch held four "1" verdicts and no "0" and the verifier locked onto accepting everything (held-out
0.278 against lock-step's 0.652); with it, none of eight async verifiers locked onto one verdict
(finals 0.460-0.748, where accepting everything scores ~0.28 and rejecting everything ~0.72).
Importance-ratio cap: async trains the verifier on samples ~0.9 versions old and a learned verdict's
log-probs move 0.1-2.3 nats a step, so the step's largest ratio exceeded 2 in 14 of 17 stale steps
(8 in 5). Held-out verifier accuracy at steps 10/12/14 on 3 async seeds: cap 8 0.38/0.50/0.57,
0.60/0.68/0.71, 0.35/0.43/0.51 against cap 2's 0.33/0.37/0.57, 0.37/0.46/0.53, 0.22/0.24/0.40; M2PO
0.44/0.52/0.57, 0.28/0.37/0.49, 0.35/0.44/0.50; groups of 4 x 32 a step no gain; ``max_lag = 1``
trained 293 s against lock-step's 326 s. The per-seed lock-step target was dropped after the first
3-seed run: seed 2's async solver peaked 0.004 short of its own seed's noisy target.

Reading the figures: a policy whose lock-step runs end no better than they started has no target, so
the headline is decided by the policies lock-step improved. Over the recipe's 20 steps the solver's
greedy first answer gains 2-4 points (one or two evaluation standard errors, so the paired accuracy
gap says more), and the verifier's verdict gains 54-64 points and decides the headline. Lock-step's
verifier ends between 0.61 and 0.71 over 5 seeds, and a few points on that level move its time by
several steps in both modes; the table therefore gives both the final accuracies at equal trained
samples and the time to lock-step's final accuracy.

Longer horizon (``--steps 30``, 5 seeds, ~1 h): train 489 s lock-step vs 149 s async, samples/s
3.27x; levels solver 0.298, verifier 0.572; the verifier 3.08x sooner, the solver 3.82x, both
policies per seed 4.37x [95% 2.50-7.66x] over the 4 seeds where both systems reached both levels;
final accuracies at equal trained samples, async - lock-step, solver +0.009 [-0.017, +0.035],
verifier +0.039 [-0.049, +0.127]. Every async verifier passes 0.5 within 80 s, every lock-step one
after 145-295 s.

    python bench/multi_policy_agentic.py --quick --json /tmp/mpa.json     # 1 seed, 2 steps, < 3 min
    python bench/multi_policy_agentic.py --json docs/results/multi_policy_agentic.json
"""

from __future__ import annotations

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
import agentic

RECIPE = _runs.REPO_ROOT / "recipes" / "multi_policy_agentic.toml"
SYSTEMS = ("astraflow_sync", "astraflow_async")
POLICIES = ("solver", "verifier")
COLOURS = {"astraflow_sync": "tab:orange", "astraflow_async": "tab:red"}

NOTES = [
    "Fairness: one recipe for both systems (models, tasks and their order, rewards, sampling, "
    "group size, groups per step, loss, learning rates, trained samples per policy, the latency "
    "distribution and its seeded delay streams); only run.mode differs.",
    "Held-out accuracy is evaluated by this bench after each run on the versions it published, "
    "each placed at the time its step was committed: evaluation costs neither system any "
    "training time. The verifier is scored on the same step's solver's greedy answers.",
    "Time to accuracy: each policy's target is the lock-step runs' final accuracy, median over "
    "seeds, for both systems and every seed (a seed's own lock-step final is reached by that "
    "lock-step run by definition, by an equally good async run about half the time); the "
    "headline is the slower policy's ratio of median times.",
    "Straggler bound: a lock-step round waits for its slowest episode, whose tool calls run one "
    "after another (solver tries, then the verifier's check): E\\[max of n draws] per call.",
    "The machine may be shared: timings are noisy; compare medians and paired intervals.",
]

# Run sizes. On a quiet 2-core machine one sync step costs ~17 s (the round waits for the slowest of
# its 128 episodes' 2-4 serial tool calls, then both trainers step), an async step ~5 s (trainers
# and engines share the cores), the first step of either ~20-30 s (the first episodes' tool calls,
# engine warm-up), plus ~40 s of start-up per run and ~5 s per evaluated version (off the clocks):
# the full run, 5 seeds x 2 systems x 20 steps, takes ~45 minutes. 500 held-out problems keep one
# evaluation's standard error near 0.02. --quick: 1 seed, 2 steps, 100 problems, ~2.5 minutes.
STEPS = 20
EVAL_EVERY = 2
EVAL_TASKS = 500
SEEDS = 5
QUICK_STEPS = 2


# ----------------------------------------------------------------------------- settings


def recipe_settings(overrides: list[str] | None = None) -> dict[str, Any]:
    """The shared hyper-parameters, read from the recipe itself (after ``overrides``)."""
    from astraflow.recipe import load_recipe

    recipe = load_recipe(RECIPE, overrides or [])
    roles = recipe.workflow.roles
    pol = {role: recipe.policies[name] for role, name in roles.items()}
    kwargs = recipe.workflow.kwargs
    return {
        "recipe": str(RECIPE.relative_to(_runs.REPO_ROOT)),
        "model": {role: p.model for role, p in pol.items()},
        "env": recipe.tasks.env,
        "env_kwargs": recipe.tasks.env_kwargs,
        "task_set": recipe.tasks.sets[0].name,
        "eval_split": recipe.evaluation.split,
        "group_size": recipe.tasks.group_size,
        "groups_per_step": {role: p.trainer.groups_per_step for role, p in pol.items()},
        "learning_rate": {role: p.trainer.learning_rate for role, p in pol.items()},
        "warmup_steps": {role: p.trainer.warmup_steps for role, p in pol.items()},
        "importance_sampling_cap": {
            role: p.trainer.importance_sampling_cap for role, p in pol.items()
        },
        "max_tokens": {role: p.sampling.max_tokens for role, p in pol.items()},
        "max_turns": recipe.workflow.max_turns,
        "verify_template": kwargs.get("verify_template", "{question}={answer}?"),
        "accept": kwargs.get("accept", "1"),
        "reject": kwargs.get("reject", "0"),
        "verifier_max_tokens": kwargs.get("verifier_max_tokens", 2),
        "verifier_tool_env": kwargs.get("verifier_tool_env"),
        "env_latency": recipe.tasks.env_latency.model_dump() if recipe.tasks.env_latency else None,
        "concurrency": recipe.rollout.concurrency,
        "max_lag": recipe.dataflow.max_lag,
        "buffer_steps": recipe.dataflow.buffer_steps,
    }


# ----------------------------------------------------------------------------- evaluation


def version_evals(
    run: _results.RunResult, settings: dict[str, Any], seed: int, every: int, steps: int
) -> dict[str, list[_records.EvalPoint]]:
    """Greedy held-out accuracy of both policies at versions 0, every, 2*every, ..., steps, read
    from the run's weight store, each placed at the time its policy's step was committed."""
    import torch
    from astraflow.tasks.catalog import load_task_set
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from astraflow.models import load_tokenizer, resolve_model
    from astraflow.rollout.workflows.multi_agent import parse_verdict

    hf_logging.disable_progress_bar()  # keep the benchmark's own output readable
    run_dir = Path(run.run_dir or "")
    records = _records.read_jsonl(run_dir / "metrics.jsonl")
    times = {p: _records.step_times(records, p) for p in POLICIES}
    models, tokenizers = {}, {}
    for p in POLICIES:
        path = resolve_model(settings["model"][p])
        tokenizers[p] = load_tokenizer(path)
        tokenizers[p].padding_side = "left"
        models[p] = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    problems = load_task_set(
        settings["task_set"], settings["eval_split"], seed=seed, limit=settings["eval_tasks"]
    )
    solve_score = _evaluation.env_scorer(settings["env"], settings["env_kwargs"])
    check = settings["verifier_tool_env"]
    check_score = _evaluation.env_scorer(check, {}) if check else None
    points: dict[str, list[_records.EvalPoint]] = {p: [] for p in POLICIES}
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the run is over: the bench has the machine
    try:
        for step in sorted({*range(0, steps + 1, every), steps}):
            if any(step and step not in times[p] for p in POLICIES) or not all(
                _evaluation.load_published(models[p], run_dir, p, step) for p in POLICIES
            ):
                _report.console.print(f"[yellow]version {step} not in the store: left out[/]")
                continue
            answers = _evaluation.greedy_texts(
                models["solver"], tokenizers["solver"], [q["question"] for q in problems],
                settings["max_tokens"]["solver"],
            )  # fmt: skip
            correct = [
                solve_score(q["question"], q["answer"], a) > 0
                for q, a in zip(problems, answers, strict=True)
            ]
            prompts = [
                settings["verify_template"].format(question=q["question"], answer=a.strip())
                for q, a in zip(problems, answers, strict=True)
            ]
            verdicts = _evaluation.greedy_texts(
                models["verifier"], tokenizers["verifier"], prompts,
                settings["verifier_max_tokens"],
            )  # fmt: skip
            right = []
            for prompt, ok, verdict in zip(prompts, correct, verdicts, strict=True):
                expected = settings["accept"] if ok else settings["reject"]
                if check_score is not None:  # the verifier's check tool scores it, as in training
                    right.append(check_score(prompt, expected, verdict))
                else:
                    v = parse_verdict(verdict, settings["accept"], settings["reject"])
                    right.append(float(v is not None and v == ok))
            acc = {"solver": sum(correct) / len(problems), "verifier": sum(right) / len(problems)}
            for p in POLICIES:
                t = 0.0 if step == 0 else max(0.0, times[p][step] - float(run.t0 or 0.0))
                points[p].append(_records.EvalPoint(step, t, acc[p]))
    finally:
        torch.set_num_threads(threads)
    return points


# ----------------------------------------------------------------------------- runs


def run_system(
    system: str, seed: int, steps: int, every: int, workdir: Path, timeout_s: float,
    settings: dict[str, Any], extra: list[str],
) -> _results.RunResult:  # fmt: skip
    mode = system.removeprefix("astraflow_")
    overrides = [
        f"run.max_steps={steps}",
        f"run.mode={json.dumps(mode)}",
        f"run.name={json.dumps('multi-policy-agentic-' + mode)}",
        "evaluation.every_steps=0",
        "evaluation.at_start=false",
        "evaluation.num_tasks=1",
        "logging.report=false",
        *(f"policies.{p}.trainer.keep_versions={steps + 1}" for p in POLICIES),
        *extra,
    ]
    result = _runs.run_recipe(
        RECIPE, overrides, system=system, seed=seed, workdir=workdir, timeout_s=timeout_s,
        final_eval=None, eval_grace_s=0.0,
    )  # fmt: skip
    if not result.ok:
        return result
    missing = [p for p in POLICIES if p not in result.policies]
    if missing:
        result.ok, result.error = False, f"no step of {missing} recorded"
        return result
    evals = version_evals(result, settings, seed, every, steps)
    run_dir = Path(result.run_dir or "")
    summary = _records.run_summary(_records.read_jsonl(run_dir / "metrics.jsonl"))
    t_end = max(p.train_s or 0.0 for p in result.policies.values())
    mean, peak, drops = agentic.lease_occupancy(
        summary, result.t0 or 0.0, (result.t0 or 0.0) + t_end
    )
    for p in POLICIES:
        res = result.policies[p]
        res.evals = evals[p]
        res.extra.update(final_eval="by the bench (published versions)", drops=drops)
        res.extra.update(episodes_in_flight_mean=mean, episodes_in_flight_max=peak)
    return result


# ----------------------------------------------------------------------------- analysis


def both_reached(times: dict[str, float | None]) -> float | None:
    """When every policy (with a target) had reached its target: the later time (None if one
    never did, or no policy has a target)."""
    if not times or any(t is None for t in times.values()):
        return None
    return max(t for t in times.values() if t is not None)


def lockstep_target(run: _results.RunResult, policy: str) -> float | None:
    """One lock-step run's final held-out accuracy of ``policy`` (the per-seed rule, reported
    beside the headline). None where it is no better than the start (the same checkpoint for both
    systems): there is no learning to time, and every run would "reach" it at the start."""
    p = run.policies[policy]
    return p.accuracy_final if improved(p.accuracy_final, p.accuracy_before) else None


def improved(final: float | None, start: float | None) -> bool:
    """Whether a final accuracy is a level to time: known and above the start."""
    return final is not None and (start is None or final > start + 1e-9)


def lockstep_targets(sync_runs: list[_results.RunResult]) -> dict[str, float | None]:
    """Per policy, the level both systems are timed to: the lock-step runs' final held-out
    accuracy, median over seeds. One level for every seed and both systems, because a per-seed
    target is biased: the lock-step run of that seed reaches its own final accuracy by definition,
    while an async run that is exactly as good reaches it only about half the time (the final
    evaluation carries the run's and the evaluation's noise). None where the median final is no
    better than the median start (nothing learnt to time)."""
    targets: dict[str, float | None] = {}
    for policy in POLICIES:
        final = _stats.spread(r.policies[policy].accuracy_final for r in sync_runs).median
        start = _stats.spread(r.policies[policy].accuracy_before for r in sync_runs).median
        targets[policy] = round(final, 4) if final is not None and improved(final, start) else None
    return targets


def analyse(runs: list[_results.RunResult], settings: dict[str, Any]) -> dict[str, Any]:
    """Per-system figures over seeds and the race to the lock-step final accuracies.

    Each policy's target is :func:`lockstep_targets`' level; per policy the speed-up is the ratio
    of the censored median times (a seed that never reaches it ranks last), and the headline is
    the slower policy's (the smaller of the two). Beside it: per seed, the time until both
    policies reached their targets (paired ratios), and the same race to each seed's own
    lock-step final accuracy (:func:`lockstep_target`)."""
    ok = {s: {r.seed: r for r in runs if r.system == s and r.ok} for s in SYSTEMS}
    seeds = sorted(set(ok["astraflow_sync"]) & set(ok["astraflow_async"]))
    targets = lockstep_targets([ok["astraflow_sync"][k] for k in seeds])
    own = {k: {p: lockstep_target(ok["astraflow_sync"][k], p) for p in POLICIES} for k in seeds}

    def race(levels: dict[int, dict[str, float | None]]) -> dict[str, dict[int, dict]]:
        """Per system, seed and policy with a level: when its evaluations first reached it."""
        return {
            s: {
                k: {
                    p: _records.time_to_accuracy(ok[s][k].policies[p].evals, level)
                    for p, level in levels[k].items()
                    if level is not None
                }
                for k in seeds
            }
            for s in SYSTEMS
        }

    tta = race({k: targets for k in seeds})
    tta_own = race(own)

    def fig(values) -> dict[str, Any]:
        return _stats.spread_json(_stats.spread(values))

    def both_median(times: dict[int, dict[str, float | None]]) -> dict[str, Any]:
        return _stats.spread_json(
            _stats.censored_spread([both_reached(times[k]) for k in seeds if times[k]])
        )

    systems: dict[str, Any] = {}
    for s in SYSTEMS:
        rs = list(ok[s].values())
        per_policy = {}
        for p in POLICIES:
            ps = [r.policies[p] for r in rs]
            per_policy[p] = {
                "steps": fig(x.steps for x in ps),
                "trained_samples": fig(x.trained_samples for x in ps),
                "train_s": fig(x.train_s for x in ps),
                "samples_per_s": fig(x.samples_per_s for x in ps),
                "acc_before": fig(x.accuracy_before for x in ps),
                "final_acc": fig(x.accuracy_final for x in ps),
                "trainer_idle": fig(x.idle_fraction for x in ps),
                "staleness_mean": fig(x.extra.get("staleness_mean") for x in ps),
                "time_to_lockstep_final_acc_s": _stats.spread_json(
                    _stats.censored_spread([tta[s][k][p] for k in seeds if p in tta[s][k]])
                ),
            }
        train = [max(x.train_s or 0.0 for x in r.policies.values()) for r in rs]
        samples = [sum(x.trained_samples for x in r.policies.values()) for r in rs]
        systems[s] = {
            "runs": len(rs),
            "train_s": fig(train),
            "samples_per_s": fig(_stats.ratio(n, t) for n, t in zip(samples, train, strict=True)),
            "trainer_idle": fig(
                _stats.spread(r.policies[p].idle_fraction for p in POLICIES).median for r in rs
            ),
            "episodes_in_flight": {
                "mean": fig(r.policies["solver"].extra.get("episodes_in_flight_mean") for r in rs),
                "max": fig(r.policies["solver"].extra.get("episodes_in_flight_max") for r in rs),
            },
            "time_to_acc_s": both_median(tta[s]),
            "time_to_own_seed_target_s": both_median(tta_own[s]),
            **per_policy,
            "drops": [r.policies["solver"].extra.get("drops") for r in rs],
        }

    def paired_speedup(times: dict[str, dict[int, dict]], policy: str | None) -> dict[str, Any]:
        def t(s: str, k: int) -> float | None:
            return both_reached(times[s][k]) if policy is None else times[s][k].get(policy)

        sync = times["astraflow_sync"]
        raced = [k for k in seeds if (sync[k] if policy is None else policy in sync[k])]
        return _stats.paired_speedup(
            [t("astraflow_sync", k) for k in raced], [t("astraflow_async", k) for k in raced]
        )

    by_policy = {
        p: _stats.ratio(
            systems["astraflow_sync"][p]["time_to_lockstep_final_acc_s"]["median"],
            systems["astraflow_async"][p]["time_to_lockstep_final_acc_s"]["median"],
        )
        for p in POLICIES
        if targets[p] is not None
    }
    gaps = {  # every paired seed, whether or not lock-step improved on the start
        p: _stats.paired(
            _diff(
                ok["astraflow_async"][k].policies[p].accuracy_final,
                ok["astraflow_sync"][k].policies[p].accuracy_final,
            )
            for k in seeds
        )
        for p in POLICIES
    }
    return {
        "seeds_paired": seeds,
        "targets": targets,
        "targets_per_seed": {str(k): v for k, v in own.items()},
        "speedup_time_to_acc": slower_policy(by_policy),
        "speedup_time_to_acc_paired": paired_speedup(tta, None),
        "speedup_time_to_acc_both": _stats.ratio(
            systems["astraflow_sync"]["time_to_acc_s"]["median"],
            systems["astraflow_async"]["time_to_acc_s"]["median"],
        ),
        "speedup_time_to_acc_by_policy": by_policy,
        "speedup_time_to_acc_by_policy_paired": {p: paired_speedup(tta, p) for p in by_policy},
        "speedup_time_to_own_seed_target": {
            "ratio": _stats.ratio(
                systems["astraflow_sync"]["time_to_own_seed_target_s"]["median"],
                systems["astraflow_async"]["time_to_own_seed_target_s"]["median"],
            ),
            "paired": paired_speedup(tta_own, None),
        },
        "speedup_samples_per_s": _stats.ratio(
            systems["astraflow_async"]["samples_per_s"]["median"],
            systems["astraflow_sync"]["samples_per_s"]["median"],
        ),
        "speedup_time_to_acc_sustained": sustained_race(runs, targets),
        "final_acc_gap_async_minus_sync": gaps,
        "systems": systems,
        "straggler": straggler_report(settings),
    }


#: The sustained criterion (``_stats.time_to_sustained``): the mean of this many consecutive
#: evaluations at or above the target, beside the first crossing the tables above time.
SUSTAINED_WINDOW = 2


def sustained_race(runs: list[_results.RunResult], targets: dict[str, float | None]) -> dict:
    """Per policy with a target, the race to it *sustained* (:data:`SUSTAINED_WINDOW`
    consecutive evaluations whose mean reaches it), sync / async: the ratio of censored median
    times and the per-seed table with censoring counted both ways."""
    ok = {s: {r.seed: r for r in runs if r.system == s and r.ok} for s in SYSTEMS}
    seeds = sorted(set(ok["astraflow_sync"]) & set(ok["astraflow_async"]))
    out: dict[str, Any] = {"window": SUSTAINED_WINDOW, "targets": targets, "by_policy": {}}
    for p, level in targets.items():
        if level is None:
            continue
        times = {
            s: [
                _stats.time_to_sustained(ok[s][k].policies[p].evals, level, SUSTAINED_WINDOW)
                for k in seeds
            ]
            for s in SYSTEMS
        }
        med = {s: _stats.censored_spread(ts).median for s, ts in times.items()}
        out["by_policy"][p] = {
            "ratio": _stats.ratio(med["astraflow_sync"], med["astraflow_async"]),
            "reached": {s: sum(t is not None for t in ts) for s, ts in times.items()},
            "paired": _stats.paired_speedup(times["astraflow_sync"], times["astraflow_async"]),
        }
    return out


def reanalyse(path: Path) -> dict[str, Any]:
    """Recount a stored ``--json`` file's paired tables from its runs (nothing is run): every
    ``*_paired`` table again with censoring counted both ways (``only_baseline`` beside
    ``only_system``), and the sustained race (:func:`sustained_race`) added; the other figures
    are kept as they were, and a ``reanalysis`` stamp says when and on what commit."""
    import _stamp

    data = json.loads(Path(path).read_text())
    runs = [_results.RunResult.from_json(r) for r in data.get("runs") or []]
    fresh = analyse(runs, data["settings"])
    for key in ("speedup_time_to_acc_paired", "speedup_time_to_acc_by_policy_paired"):
        data[key] = fresh[key]
    data.setdefault("speedup_time_to_own_seed_target", {})["paired"] = fresh[
        "speedup_time_to_own_seed_target"
    ]["paired"]
    data["speedup_time_to_acc_sustained"] = fresh["speedup_time_to_acc_sustained"]
    data["failed_runs"] = [_results.failure_entry("multi_policy", r) for r in runs if not r.ok]
    stamp = _stamp.stamp(["multi_policy_agentic.py", "--reanalyse", str(path)])
    data["reanalysis"] = {k: stamp[k] for k in ("command", "commit", "dirty", "date")}
    _report.write_json(path, data)
    return data


def slower_policy(by_policy: dict[str, float | None]) -> float | None:
    """The headline: the smaller of the policies' speed-ups (None if one has none, or no policy
    has a target)."""
    if not by_policy or any(v is None for v in by_policy.values()):
        return None
    return min(v for v in by_policy.values() if v is not None)


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def straggler_report(settings: dict[str, Any]) -> dict[str, Any]:
    """The bound from the latency distribution: a lock-step round of ``batch`` episodes waits for
    the slowest of each of its serial tool calls (up to ``max_turns`` solver tries, then the
    verifier's check), E[max of batch draws] each; an asynchronous pipeline pays the mean."""
    from astraflow.envs.wrappers.latency import straggler_bound

    dist = agentic.latency_distribution(settings)
    batch = settings["group_size"] * max(settings["groups_per_step"].values())
    calls = settings["max_turns"] + (1 if settings["verifier_tool_env"] else 0)
    bound = straggler_bound(dist, batch, calls)
    bound["distribution"] = dist.describe()
    bound["tool_calls_per_episode_max"] = calls
    bound["mean_tool_time_per_episode_max_s"] = calls * dist.mean()
    return bound


# ----------------------------------------------------------------------------- report


def print_report(summary: dict[str, Any], runs: list[_results.RunResult]) -> None:
    sp = _report.spread_text
    rows = []
    for s, d in summary["systems"].items():
        for p in POLICIES:
            q = d[p]
            rows.append(
                [
                    f"{s} / {p}",
                    str(d["runs"]),
                    f"{sp(q['steps'], '{:.0f}')} ({sp(q['trained_samples'], '{:.0f}')})",
                    sp(q["train_s"], "{:.0f}", "s"),
                    sp(q["samples_per_s"], "{:.1f}"),
                    f"{sp(q['acc_before'], '{:.3f}')} → {sp(q['final_acc'], '{:.3f}')}",
                    sp(q["time_to_lockstep_final_acc_s"], "{:.0f}", "s"),
                    sp(q["trainer_idle"], "{:.2f}"),
                    sp(q["staleness_mean"], "{:.2f}"),
                    sp(d["episodes_in_flight"]["mean"], "{:.0f}")
                    + " / "
                    + sp(d["episodes_in_flight"]["max"], "{:.0f}"),
                ]
            )
    _report.console.print(
        _report.table(
            "Multi-policy agentic (solver + verifier, long-tailed tools): lock-step vs async "
            "(median [min–max] over seeds)",
            [
                "system / policy",
                "runs",
                "steps (samples)",
                "train",
                "samples/s",
                "held-out acc start → final",
                "to lock-step final acc",
                "trainer idle",
                "staleness",
                "in flight mean / max",
            ],
            rows,
        )  # fmt: skip
    )
    paired = summary["speedup_time_to_acc_paired"]
    ci = paired["ci95"]
    own = summary["speedup_time_to_own_seed_target"]
    targets = ", ".join(f"{p} {_report.fmt(v, '{:.3f}')}" for p, v in summary["targets"].items())
    _report.console.print(
        f"time to the lock-step final accuracy ({targets}), sync / async, the slower policy: "
        f"[bold]{_report.fmt(summary['speedup_time_to_acc'], '{:.2f}', 'x')}[/] (target >= 2.7x); "
        "by policy: "
        + ", ".join(
            f"{p} {_report.fmt(v, '{:.2f}', 'x')}"
            for p, v in summary["speedup_time_to_acc_by_policy"].items()
        )
        + "; both policies per seed: "
        + (
            f"{paired['geo_mean']:.2f}x"
            + (f" [95% {ci[0]:.2f}-{ci[1]:.2f}x]" if ci else "")
            + f" over {paired['reached']} seeds"
            if paired["reached"]
            else "no seed where both systems reached both"
        )
        + f"; to each seed's own lock-step final: {_report.fmt(own['ratio'], '{:.2f}', 'x')}"
        + f"; samples/s async / sync {_report.fmt(summary['speedup_samples_per_s'], '{:.2f}', 'x')}"
    )
    for p, gap in summary["final_acc_gap_async_minus_sync"].items():
        ci = gap["ci95"]
        _report.console.print(
            f"final accuracy at equal trained samples, {p}, async - sync: "
            f"[bold]{_report.fmt(gap['mean'], '{:+.3f}')}[/]"
            + (f" (95% [{ci[0]:+.3f}, {ci[1]:+.3f}])" if ci else "")
            + f" over {gap['n']} paired seeds"
        )
    b = summary["straggler"]
    dist = b["distribution"]
    _report.console.print(
        f"straggler bound ({dist['distribution']}, p50 {dist['p50_s']:.2f}s, p99 "
        f"{dist['p99_s']:.2f}s, mean {dist['mean_s']:.2f}s): a round of {b['batch']} episodes "
        f"waits E\\[max] = {b['expected_max_s']:.2f}s per tool call ({b['tail_ratio']:.1f}x the "
        f"mean), up to {b['lockstep_wait_per_step_s']:.1f}s per round for "
        f"{b['tool_calls_per_episode_max']} serial calls; async pays the mean, "
        f"{b['mean_tool_time_per_episode_max_s']:.1f}s per episode at most, hidden by the "
        "episodes in flight"
    )
    _report.print_failures(runs, NOTES)


def plot(runs: list[_results.RunResult], path: Path) -> Path | None:
    return _plots.plot_accuracy(
        runs, path, COLOURS, "Multi-policy agentic: one line per seed",
        "seconds since training start (evaluation off the clock)", policies=POLICIES,
        marker="o", ms=3,
    )  # fmt: skip


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = _cli.bench_parser(__doc__)
    _cli.add_output_flags(ap, quick="1 seed, 2 steps per policy (under 3 minutes)")
    _cli.add_run_flags(ap, seeds_default=SEEDS)
    _cli.add_comparison_flags(ap, SYSTEMS)
    _cli.add_set_flag(ap, who="both systems")
    ap.add_argument(
        "--reanalyse",
        type=Path,
        default=None,
        metavar="JSON",
        help="recount the paired tables of a stored --json file (censoring both ways, the "
        "sustained race) from its runs, without running, and write them into it",
    )
    ap.add_argument(
        "--allow-dirty",
        action="store_true",
        help="write --json from a tree with uncommitted changes (marked allow_dirty in the "
        "JSON; without it docs/results.md refuses the figures as headlines)",
    )
    ns = ap.parse_args(argv)
    if ns.reanalyse:
        data = reanalyse(ns.reanalyse)
        _report.console.print(f"re-analysed {ns.reanalyse}: {data['speedup_time_to_acc_paired']}")
        return 0
    if ns.json and not ns.quick and not ns.allow_dirty and not getattr(ns, "from_json", None):
        import _stamp

        if _stamp.stamp().get("dirty"):
            ap.error(
                "the tree has uncommitted changes: a headline is measured on a clean tree "
                "(commit first, or pass --allow-dirty, which marks the JSON)"
            )
    settings = recipe_settings(ns.sets)
    seeds = ns.seeds or (1 if ns.quick else SEEDS)
    steps = ns.steps or (QUICK_STEPS if ns.quick else STEPS)
    every = ns.eval_every or (1 if ns.quick else EVAL_EVERY)
    settings["eval_tasks"] = ns.eval_tasks or (100 if ns.quick else EVAL_TASKS)
    timeout = ns.timeout or (300.0 if ns.quick else 900.0)
    systems = _cli.parse_systems(ap, ns.systems, SYSTEMS)
    settings.update(max_steps=steps, eval_every=every, seeds=seeds, overrides=list(ns.sets))
    settings["astraflow_extra_overrides"] = list(ns.af_set)

    runs: list[_results.RunResult] = []
    if ns.from_json:
        saved = json.loads(ns.from_json.read_text())
        runs = [_results.RunResult.from_json(r) for r in saved["runs"]]
        settings, seeds = saved["settings"], 0
    with _runs.bench_workdir(ns.workdir, "astraflow-mpagent-") as workdir:
        for seed in range(seeds):
            for system in systems:
                label = f"{system} seed {seed} ({steps} steps per policy)"
                job = partial(run_system, system, seed, steps, every, workdir, timeout, settings,
                              [*ns.sets, *ns.af_set])  # fmt: skip
                runs.append(_runs.run_logged(label, job, None))
        summary = analyse(runs, settings)
        print_report(summary, runs)
        plot_path = ns.plot or (ns.json.with_suffix(".png") if ns.json else None)
        plotted = _plots.plot_safely(lambda: plot(runs, plot_path)) if plot_path else None
        if ns.json:
            flat = {
                s: {
                    "train_s": d["train_s"]["median"],
                    "samples_per_s": d["samples_per_s"]["median"],
                    "trainer_idle": d["trainer_idle"]["median"],
                    "episodes_in_flight": {
                        k: v["median"] for k, v in d["episodes_in_flight"].items()
                    },
                    "time_to_acc_s": d["time_to_acc_s"]["median"],
                    **{
                        p: {
                            "final_acc": d[p]["final_acc"]["median"],
                            "acc_before": d[p]["acc_before"]["median"],
                            "samples_per_s": d[p]["samples_per_s"]["median"],
                            "trainer_idle": d[p]["trainer_idle"]["median"],
                            "time_to_lockstep_final_acc_s": d[p]["time_to_lockstep_final_acc_s"][
                                "median"
                            ],
                        }
                        for p in POLICIES
                    },
                }
                for s, d in summary["systems"].items()
            }
            payload = {
                "benchmark": "multi_policy_agentic",
                "quick": ns.quick,
                "settings": settings,
                **summary,
                **flat,
                "allow_dirty": bool(ns.allow_dirty),
                "notes": NOTES,
                "plot": _plot_ref(plotted),
                "runs": [r.to_json() for r in runs],
            }
            _report.write_json(ns.json, payload)
            _report.console.print(f"wrote {ns.json}")
    return 0 if runs and all(r.ok for r in runs) else 1


def _plot_ref(path: Path | None) -> str | None:
    """The plot's path, relative to the repository when it lies inside it (docs link to it)."""
    if path is None:
        return None
    try:
        return str(Path(path).resolve().relative_to(_runs.REPO_ROOT))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    sys.exit(main())
