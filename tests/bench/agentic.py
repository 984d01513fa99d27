"""Agentic RL with slow tools: AstraFlow (async and lock-step) versus TRL's ``GRPOTrainer``.

The task is multi-turn: ``astraflow/MathMultiTurn-v0`` over the generated arithmetic set, up to 3
tries per problem with "incorrect, try again" feedback, and every answer is checked by a *tool*
whose latency is I/O-bound and long-tailed (``[tasks.env_latency]`` of
``recipes/agentic_math.toml``: log-normal, median 0.3 s, p99 5 s; ``envs/wrappers/latency.py``).
Three systems train ``builtin:tiny-arith`` with the same tasks, reward (the episode's return: 1 when
any try is right), sampling, learning rate, group size, loss (DAPO, beta 0) and trained samples:

* ``trl``: ``trl.GRPOTrainer`` (1.16) with a ``rollout_func`` that plays the episodes of a batch
  turn by turn: one batched ``generate`` over every episode still running, then every tool call of
  that turn *concurrently* (``asyncio.gather`` over the latency wrapper's ``astep``: the batch waits
  for its slowest call, not for the sum), the feedback appended as tokens with ``env_mask = 0`` so
  the loss covers only generated tokens. Same token rendering as AstraFlow's workflow (the
  ``ChatRenderer``), same delay distribution; no poll or sleep beyond the tool latency. Why
  ``rollout_func`` and not ``tools``/``environment_factory``: those need the model to emit JSON tool
  calls in its chat template, which the tiny policy cannot; ``rollout_func`` is TRL's own hook for
  custom multi-turn rollouts and keeps TRL's generation (the trainer's model and
  ``generation_config``), loss and optimizer.
* ``astraflow_sync``: ``astraflow train recipes/agentic_math.toml`` with ``run.mode = sync``
  (lock-step rounds: lease a step's groups, run them all concurrently, train, repeat).
* ``astraflow_async``: the same recipe, default asynchronous dataflow: ~1000 episodes in flight on
  the node, most of them waiting on the tool, while the trainer trains on what has come back.

Reported: time to a ladder of held-out accuracies (greedy, first answer, on the arith test split,
evaluated by the bench off every system's clock as in ``vs_trl.py``), samples/s, trainer idle
fraction, episodes in flight (mean/max over the training window) and the straggler bound: what a
lock-step system must wait per step for the tail of the latency distribution, E[max of n draws] per
turn, against the mean an asynchronous system pays.

A second case (``--cases sandbox``; part of the full run, 1 seed) puts a *real* tool in the loop:
``recipes/agentic_code.toml``, ``astraflow/CodeMultiTurn-v0`` on generated one-line functions
(``code_gen``), every attempt run with its tests in the bubblewrap sandbox (a subprocess per call,
no simulated delay; skipped, with the reason, where ``bwrap`` is missing or does not run). The env
runs unfenced replies (``fence = "optional"``) so the tiny policy's text reaches the sandbox; it
cannot code, so the pass rate stays near 0 and the figures are about the system: samples/s,
trainer idle, episodes in flight, the sandbox's own run time p50/p99 (last run of each episode, from
the env's info) and, for TRL, the wall time of each call in its thread pool. TRL's ``rollout_func``
runs a turn's sandbox calls concurrently in as many threads as a rollout node has
(``rollout.env_workers``). JSON: ``sandbox.<system>.*``, ``sandbox.speedup_async_over_sync_samples_per_s``,
``sandbox.speedup_async_over_trl_samples_per_s``.

    python tests/bench/agentic.py --quick --json /tmp/agentic.json        # math, 1 seed, ~2.5 min
    python tests/bench/agentic.py --seeds 3 --json /tmp/agentic.json --plot /tmp/agentic.png
    python tests/bench/agentic.py --cases sandbox --json /tmp/agentic-sandbox.json
"""

from __future__ import annotations

import argparse
import json
import math
import sqlite3
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import _harness as H
import _trl as T

RECIPE = H.REPO_ROOT / "recipes" / "agentic_math.toml"
CODE_RECIPE = H.REPO_ROOT / "recipes" / "agentic_code.toml"
RECIPES = {"math": RECIPE, "sandbox": CODE_RECIPE}
CASES = tuple(RECIPES)
SYSTEMS = ("trl", "astraflow_sync", "astraflow_async")
COLOURS = {"trl": "tab:blue", "astraflow_sync": "tab:orange", "astraflow_async": "tab:red"}

NOTES = [
    "Fairness: same model, tasks (loader order), reward, sampling, group size, groups per step, "
    "loss, learning rate and trained samples; the same latency distribution, applied by the same "
    "wrapper, each env with its own delay stream. TRL runs its tool calls of a turn concurrently "
    "(its best case) and gets 2 torch threads (it runs alone); AstraFlow's services get 1 each.",
    "Held-out accuracy: greedy first answer on the arith test split, scored by the env, evaluated "
    "by this bench off every system's clock (TRL in a paused callback, AstraFlow on the weight "
    "versions it published, each placed at the time its step was committed).",
    "Straggler bound: a lock-step batch waits at each turn for its slowest tool call, E\\[max of n "
    "draws]; an asynchronous pipeline with enough episodes in flight pays only the mean, spread "
    "over the episodes that wait together.",
    "The machine may be shared: timings are noisy; compare medians over seeds.",
]


# Run sizes. The lock-step baselines pay the latency tail at every turn (TRL ~25 s, sync ~16 s per
# step; async ~4 s, trainer-bound), so one math step costs ~45 s of wall time over the three
# systems, plus ~40 s of start-ups and a few seconds per 500-problem evaluation (off the clocks):
# 8 steps x 3 seeds ~25 min, and the sandbox case ~4 min. 500 held-out problems keep one
# evaluation's standard error near 0.018 (0.028 at 200), which matters because the headline times
# the systems to TRL's final accuracy, a point that one noisy evaluation can move.
# --quick (math, 1 seed, 2 steps, 100 problems) takes ~2.5 minutes.
STEPS = 8
EVAL_EVERY = 2
EVAL_TASKS = 500
SANDBOX_STEPS = 6
QUICK_STEPS = 2

# ----------------------------------------------------------------------------- settings


def recipe_settings(
    overrides: list[str] | None = None, recipe_path: Path = RECIPE
) -> dict[str, Any]:
    """The shared hyper-parameters, read from the recipe itself (after ``overrides``)."""
    from astraflow.recipe import load_recipe

    recipe = load_recipe(recipe_path, overrides or [])
    latency = recipe.tasks.env_latency
    return T.grpo_settings(recipe) | {
        "max_turns": recipe.workflow.max_turns,
        "env_latency": latency.model_dump() if latency is not None else None,
        "concurrency": recipe.rollout.concurrency,
        "env_workers": recipe.rollout.env_workers,
        "buffer_steps": recipe.dataflow.buffer_steps,
        "max_lag": recipe.dataflow.max_lag,
    }


def latency_distribution(settings: dict[str, Any]):
    from envs.wrappers.latency import LatencyDistribution

    cfg = dict(settings["env_latency"] or {"distribution": "fixed", "value_s": 0.0})
    return LatencyDistribution.from_config(
        {k: v for k, v in cfg.items() if k not in ("on", "inner", "seed")}
    )


# ----------------------------------------------------------------------------- TRL worker


def trl_worker(ns: argparse.Namespace) -> None:
    """Stock ``trl.GRPOTrainer`` with a multi-turn ``rollout_func``; AstraFlow-format metrics."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from astraflow.rollout.workflows.tokens import ChatRenderer
    from envs import make_env
    from envs.wrappers.latency import LatencyEnvFactory

    w = T.Worker.start(ns)
    cfg, tokenizer, train = w.cfg, w.tokenizer, w.train_tasks
    # TRL hands rollout_func only the prompts: key each task by its prompt's text (math: the
    # question; code: the task id, as the env renders the prompt itself on reset).
    code = "question" not in train[0]
    keys = [p["id"] if code else p["question"] for p in train]
    tasks = dict(zip(keys, train, strict=True))
    renderer = ChatRenderer(tokenizer)
    latency = cfg["env_latency"]

    def build(env_id: str, kwargs: dict[str, Any]):
        return make_env(env_id, **{**cfg["env_kwargs"], **kwargs})

    # The same wrapper and seeding scheme as a rollout node (stream "trl" instead of a node name).
    factory = LatencyEnvFactory(build, latency, seed=ns.seed, stream="trl") if latency else build
    state: dict[str, Any] = {  # the in-flight accounting; TRL's clock is the Worker's
        "env_wait_s": 0.0,
        "in_flight_integral": 0.0,
        "in_flight_max": 0,
        "active_per_turn": [],
        "sandbox_s": [],  # the sandbox's own duration of each episode's last run (env info)
        "call_s": [],  # wall time of every env step (a sandbox run and its queueing)
    }
    # Envs without async calls (the sandbox) step in threads, as many as a rollout node has.
    pool = ThreadPoolExecutor(cfg.get("env_workers") or 32, thread_name_prefix="trl-env")

    def timed_step(env, text: str):
        started = time.perf_counter()
        result = env.step(text)
        state["call_s"].append(time.perf_counter() - started)
        return result

    def generate(trainer, seqs: list[list[int]]) -> list[list[int]]:
        """One batched sampling call, as TRL's own transformers path does it."""
        ids, mask = H.left_pad(seqs, tokenizer.pad_token_id)
        width = ids.shape[1]
        unwrapped = trainer.accelerator.unwrap_model(trainer.model)
        with torch.no_grad():
            full = unwrapped.generate(
                input_ids=ids, attention_mask=mask, generation_config=trainer.generation_config
            )
        outs = []
        eos = set(trainer.eos_token_ids)
        for row in full[:, width:].tolist():
            cut = next((i for i, t in enumerate(row) if t in eos), None)
            outs.append(row[: cut + 1] if cut is not None else row)
        return outs

    def rollout_func(prompts: list, trainer) -> dict[str, Any]:
        n = len(prompts)
        envs = [factory(cfg["env"], {"max_turns": cfg["max_turns"]}) for _ in range(n)]
        questions = [p[-1]["content"] if isinstance(p, list) else str(p) for p in prompts]

        async def reset_all():
            return await asyncio.gather(
                *(
                    e.areset(options={"task": {"question": q, "answer": tasks[q]["answer"]}})
                    for e, q in zip(envs, questions, strict=True)
                )
            )

        if latency:
            firsts = asyncio.run(reset_all())
        else:
            firsts = list(
                pool.map(lambda e, q: e.reset(options={"task": tasks[q]}), envs, questions)
            )
        prompt_ids = [renderer.prompt_ids(obs) for obs, _ in firsts]
        completion = [[] for _ in range(n)]
        env_mask = [[] for _ in range(n)]
        rewards = [0.0] * n
        active = list(range(n))
        turns = []
        for _turn in range(cfg["max_turns"]):
            if not active:
                break
            turns.append(len(active))
            started = time.perf_counter()
            gens = generate(trainer, [prompt_ids[i] + completion[i] for i in active])
            for i, g in zip(active, gens, strict=True):
                completion[i] += g
                env_mask[i] += [1] * len(g)
            texts = tokenizer.batch_decode(gens, skip_special_tokens=True)

            async def step_all(active=active, texts=texts):
                return await asyncio.gather(
                    *(envs[i].astep(t) for i, t in zip(active, texts, strict=True))
                )

            waited = time.perf_counter()
            if latency:
                results = asyncio.run(step_all())
            else:  # every sandbox run of the turn at once, in threads (each is a subprocess)
                results = list(pool.map(timed_step, [envs[i] for i in active], texts))
            done_at = time.perf_counter()
            state["env_wait_s"] += done_at - waited
            state["in_flight_integral"] += len(active) * (done_at - started)
            state["in_flight_max"] = max(state["in_flight_max"], len(active))
            still = []
            for i, g, (obs, reward, terminated, truncated, _info) in zip(
                active, gens, results, strict=True
            ):
                rewards[i] += float(reward)
                if terminated or truncated:
                    if "sandbox" in _info:
                        state["sandbox_s"].append(_info["sandbox"].get("duration_s"))
                    continue
                feedback = renderer.observation_ids(obs, g)
                completion[i] += feedback
                env_mask[i] += [0] * len(feedback)
                still.append(i)
            active = still
        state["active_per_turn"].append(turns)
        for e in envs:
            e.close()
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": completion,
            "logprobs": None,  # only used by TRL's vLLM importance-sampling correction
            "env_mask": env_mask,
            "env_reward": rewards,
        }

    def env_return(prompts, completions, env_reward, **_: Any) -> list[float]:
        return list(env_reward)

    def step_fields() -> dict[str, Any]:
        return {
            "env_wait_s_total": state["env_wait_s"],
            "in_flight_integral": state["in_flight_integral"],
            "in_flight_max": state["in_flight_max"],
            "active_per_turn": state["active_per_turn"][-1] if state["active_per_turn"] else [],
        }

    def info_fields() -> dict[str, Any]:
        return {k: state[k] for k in ("env_wait_s", "active_per_turn", "sandbox_s", "call_s")}

    rows = [{"prompt": [{"role": "user", "content": k}]} for k in keys]
    w.train(rows, [env_return], rollout_func, step_fields, info_fields)
    pool.shutdown()


def run_trl(
    seed: int, steps: int, eval_every: int, eval_tasks: int, threads: int, workdir: Path,
    timeout_s: float, settings: dict[str, Any], case: str = "math",
) -> H.RunResult:  # fmt: skip
    return T.run_worker(
        Path(__file__), "trl", seed, steps, eval_every, eval_tasks, threads,
        workdir / f"{case}-trl-s{seed}", workdir / f"{case}-trl-s{seed}.log", timeout_s, settings,
        env={"TRL_EXPERIMENTAL_SILENCE": "1"}, extras=_trl_extras,
    )  # fmt: skip


def _trl_extras(
    res: H.PolicyResult, steps_recs: list[dict[str, Any]], info: dict[str, Any]
) -> None:
    """The agentic figures of a TRL run: tool wait, episodes in flight and active per turn (from
    its step events), the sandbox's run times and its env calls' wall times (from trl.json)."""
    if steps_recs and res.train_s:
        last = steps_recs[-1]
        res.extra["env_wait_s_per_step"] = float(last["env_wait_s_total"]) / len(steps_recs)
        res.extra["episodes_in_flight_mean"] = float(last["in_flight_integral"]) / res.train_s
        res.extra["episodes_in_flight_max"] = int(last["in_flight_max"])
        res.extra["active_per_turn"] = [r.get("active_per_turn") for r in steps_recs]
    if info.get("sandbox_s"):
        res.extra["sandbox_s"] = [x for x in info["sandbox_s"] if x is not None]
        res.extra["env_call_s"] = info.get("call_s") or []


# ----------------------------------------------------------------------------- AstraFlow


def lease_occupancy(
    db_path: Path, t_start: float, t_end: float
) -> tuple[float | None, int | None, dict[str, int]]:
    """Episodes in flight on the rollout nodes over [t_start, t_end], from the dataflow store.

    A training lease holds its group's episodes from ``issued_at`` until the node pushes them (the
    episodes' ``created_at``). Returns the time-weighted mean, the maximum, and the drop counts by
    reason (what the dataflow policies discarded, e.g. samples past the staleness bound)."""
    if not Path(db_path).exists() or t_end <= t_start:
        return None, None, {}
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=10.0)
    try:
        rows = conn.execute(
            "SELECT l.issued_at, MIN(e.created_at), COUNT(e.id) FROM leases l "
            "JOIN episodes e ON e.lease_id = l.id WHERE e.is_eval = 0 GROUP BY l.id"
        ).fetchall()
        drops = {f"{p}:{r}": int(c) for p, r, c in conn.execute("SELECT * FROM drops")}
    finally:
        conn.close()
    events: list[tuple[float, int]] = []
    for issued, pushed, n in rows:
        a, b = max(float(issued), t_start), min(float(pushed), t_end)
        if b > a:
            events += [(a, int(n)), (b, -int(n))]
    if not events:
        return 0.0, 0, drops
    events.sort()
    level = peak = 0
    area = 0.0
    prev = t_start
    for t, delta in events:
        area += level * (t - prev)
        prev = t
        level += delta
        peak = max(peak, level)
    return area / (t_end - t_start), peak, drops


def episode_sandbox_runs(db_path: Path) -> tuple[list[float], list[float]]:
    """The sandbox's own duration of each training episode's last run (the env's info, as the
    node stored it) and the episodes' returns, from the dataflow store."""
    if not Path(db_path).exists():
        return [], []
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=10.0)
    try:
        rows = conn.execute("SELECT info, rewards FROM episodes WHERE is_eval = 0").fetchall()
    finally:
        conn.close()
    durations, returns = [], []
    for info, rewards in rows:
        info = json.loads(info or "{}") or {}
        run = (info.get("info") or info).get("sandbox")  # the env's info, as the node nests it
        if isinstance(run, dict) and isinstance(run.get("duration_s"), (int, float)):
            durations.append(float(run["duration_s"]))
        returns += [float(v) for v in (json.loads(rewards or "{}") or {}).values()]
    return durations, returns


def run_astraflow(
    mode: str, seed: int, steps: int, eval_every: int, eval_tasks: int, workdir: Path,
    timeout_s: float, settings: dict[str, Any], extra: list[str], case: str = "math",
) -> H.RunResult:  # fmt: skip
    import vs_trl

    overrides = [
        f"run.max_steps={steps}",
        f"run.mode={json.dumps(mode)}",
        f"run.name={json.dumps(f'agentic-{case}-{mode}')}",
        "evaluation.every_steps=0",
        "evaluation.at_start=false",
        f"evaluation.num_tasks={max(1, eval_tasks)}",
        "logging.report=false",
        f"policies.policy.trainer.keep_versions={steps + 1}",
        *extra,
    ]
    result = H.run_recipe(
        RECIPES[case], overrides, system=f"astraflow_{mode}", seed=seed,
        workdir=workdir / case if case != "math" else workdir, timeout_s=timeout_s,
        final_eval=None, eval_grace_s=0.0,
    )  # fmt: skip
    if result.ok and "policy" in result.policies:
        res = result.policies["policy"]
        if eval_tasks:
            res.evals = vs_trl.published_version_evals(result, settings, seed, eval_every, steps)
            res.extra["final_eval"] = "by the bench (published versions)"
        run_dir = Path(result.run_dir or "")
        if case == "sandbox":
            res.extra["sandbox_s"], res.extra["returns"] = episode_sandbox_runs(
                run_dir / "dataflow.db"
            )
        if result.t0 is not None and res.train_s:
            mean, peak, drops = lease_occupancy(
                run_dir / "dataflow.db", result.t0, result.t0 + res.train_s
            )
            res.extra["episodes_in_flight_mean"] = mean
            res.extra["episodes_in_flight_max"] = peak
            res.extra["drops"] = drops
    return result


# ----------------------------------------------------------------------------- analysis


def analyse(runs: list[H.RunResult], settings: dict[str, Any]) -> dict[str, Any]:
    ok = H.successful_runs(runs, SYSTEMS)
    by_system = {s: [r.policies["policy"] for r in rs] for s, rs in ok.items()}
    before = H.spread(p.accuracy_before for ps in by_system.values() for p in ps).median
    trl_final = H.spread(p.accuracy_final for p in by_system.get("trl", [])).median
    # The ladder: every 0.01 from just above the start to the best median final accuracy.
    finals = [H.spread(p.accuracy_final for p in ps).median for ps in by_system.values() if ps]
    top = max((f for f in finals if f is not None), default=None)
    levels = H.accuracy_levels(before, top)
    systems: dict[str, Any] = {}
    for s, ps in by_system.items():
        tta_trl = [H.time_to_accuracy(p.evals, trl_final) if trl_final else None for p in ps]
        systems[s] = {
            **H.throughput_json(ok[s]),
            "acc_before": H.spread_json(H.spread(p.accuracy_before for p in ps)),
            "final_acc": H.spread_json(H.spread(p.accuracy_final for p in ps)),
            "trainer_idle": H.spread_json(H.spread(p.idle_fraction for p in ps)),
            "episodes_in_flight": {
                "mean": H.spread_json(H.spread(p.extra.get("episodes_in_flight_mean") for p in ps)),
                "max": H.spread_json(H.spread(p.extra.get("episodes_in_flight_max") for p in ps)),
            },
            "time_to_trl_final_acc_s": H.spread_json(H.censored_spread(tta_trl)),
            "time_to_trl_final_acc_reached": sum(t is not None for t in tta_trl),
            "time_to_acc": {
                f"{lvl:.2f}": H.censored_spread(
                    [H.time_to_accuracy(p.evals, lvl) for p in ps]
                ).median
                for lvl in levels
            },
            "env_wait_s_per_step": H.spread_json(
                H.spread(p.extra.get("env_wait_s_per_step") for p in ps)
            ),
            "generate_s_per_step": H.spread_json(
                H.spread(p.extra.get("generate_s_per_step") for p in ps)
            ),
            "staleness_mean": H.spread_json(H.spread(p.extra.get("staleness_mean") for p in ps)),
            "drops": [p.extra.get("drops") for p in ps if p.extra.get("drops") is not None],
        }
    tta = {s: systems[s]["time_to_trl_final_acc_s"]["median"] for s in systems}
    return {
        "accuracy_before": before,
        "trl_final_acc": trl_final,
        "ladder": [f"{lvl:.2f}" for lvl in levels],
        "systems": systems,
        "speedup_vs_trl": H.ratio(tta.get("trl"), tta.get("astraflow_async")),
        "speedup_async_over_sync": H.ratio(tta.get("astraflow_sync"), tta.get("astraflow_async")),
        "speedup_sync_vs_trl": H.ratio(tta.get("trl"), tta.get("astraflow_sync")),
        "samples_per_s_async_over_trl": H.ratio(
            systems.get("astraflow_async", {}).get("samples_per_s", {}).get("median"),
            systems.get("trl", {}).get("samples_per_s", {}).get("median"),
        ),
        "straggler": straggler_report(settings, by_system.get("trl", [])),
    }


def quantile(xs: list[float], q: float) -> float | None:
    """Nearest-rank quantile (None for no data)."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))] if xs else None


def analyse_sandbox(runs: list[H.RunResult], settings: dict[str, Any]) -> dict[str, Any]:
    """Throughput figures of the sandbox case (the tiny policy's pass rate stays ~0: no ladder)."""
    out: dict[str, Any] = {"settings": settings}
    for s in SYSTEMS:
        ps = [
            r.policies["policy"] for r in runs if r.system == s and r.ok and "policy" in r.policies
        ]
        if not ps:
            continue
        durations = [x for p in ps for x in p.extra.get("sandbox_s") or []]
        calls = [x for p in ps for x in p.extra.get("env_call_s") or []]
        returns = [x for p in ps for x in p.extra.get("returns") or []]
        rewards = [p.reward_final for p in ps if p.reward_final is not None]
        out[s] = {
            "runs": len(ps),
            "train_s": H.spread(p.train_s for p in ps).median,
            "samples_per_s": H.spread(p.samples_per_s for p in ps).median,
            "trained_samples": H.spread(p.trained_samples for p in ps).median,
            "trainer_idle": H.spread(p.idle_fraction for p in ps).median,
            "episodes_in_flight": {
                "mean": H.spread(p.extra.get("episodes_in_flight_mean") for p in ps).median,
                "max": H.spread(p.extra.get("episodes_in_flight_max") for p in ps).median,
            },
            # the sandbox's own run time (bwrap + python + tests), last run of each episode
            "sandbox_call_s": {
                "p50": quantile(durations, 0.5),
                "p99": quantile(durations, 0.99),
                "n": len(durations),
            },
            # TRL only: wall time of each env step in its thread pool (run + queueing)
            "env_call_wall_s": {
                "p50": quantile(calls, 0.5),
                "p99": quantile(calls, 0.99),
                "n": len(calls),
            }
            if calls
            else None,
            "return_mean": (sum(returns) / len(returns))
            if returns
            else (sum(rewards) / len(rewards) if rewards else None),
            "staleness_mean": H.spread(p.extra.get("staleness_mean") for p in ps).median,
        }

    def sps(system: str) -> float | None:
        return (out.get(system) or {}).get("samples_per_s")

    out["speedup_async_over_sync_samples_per_s"] = H.ratio(
        sps("astraflow_async"), sps("astraflow_sync")
    )
    out["speedup_async_over_trl_samples_per_s"] = H.ratio(sps("astraflow_async"), sps("trl"))
    return out


def print_sandbox_report(summary: dict[str, Any], runs: list[H.RunResult]) -> None:
    rows = []
    for s in SYSTEMS:
        d = summary.get(s)
        if not d:
            continue
        call, wall = d["sandbox_call_s"], d["env_call_wall_s"]
        rows.append(
            [
                s,
                H.fmt(d["train_s"], "{:.0f}", "s"),
                H.fmt(d["samples_per_s"], "{:.1f}"),
                H.fmt(d["trainer_idle"], "{:.2f}"),
                H.fmt(d["episodes_in_flight"]["mean"], "{:.0f}")
                + " / "
                + H.fmt(d["episodes_in_flight"]["max"], "{:.0f}"),
                f"{H.fmt(call['p50'], '{:.2f}', 's')} / {H.fmt(call['p99'], '{:.2f}', 's')}"
                + (f" (wall {wall['p50']:.2f}s / {wall['p99']:.2f}s)" if wall else ""),
                H.fmt(d["return_mean"], "{:.3f}"),
            ]
        )
    H.console.print(
        H.table(
            "Agentic code in a real bubblewrap sandbox (throughput; the tiny policy cannot code, "
            "so its pass rate stays ~0)",
            [
                "system",
                "train",
                "samples/s",
                "trainer idle",
                "in flight mean / max",
                "sandbox run p50 / p99",
                "return",
            ],
            rows,
        )  # fmt: skip
    )
    H.console.print(
        "samples/s: async over sync "
        f"[bold]{H.fmt(summary['speedup_async_over_sync_samples_per_s'], '{:.2f}', 'x')}[/], "
        f"async over TRL [bold]{H.fmt(summary['speedup_async_over_trl_samples_per_s'], '{:.2f}', 'x')}[/]"
    )
    for r in runs:
        if not r.ok:
            H.console.print(f"[red]sandbox {r.system} seed {r.seed} failed:[/] {r.error}")


def sandbox_unavailable() -> str | None:
    """Why the sandbox case cannot run here (None when it can)."""
    import shutil

    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed (apt-get install bubblewrap; .ci/run does)"
    try:
        from envs.sandbox import select_backend

        box = select_backend("bwrap")
        try:
            result = box.run("print('ok')")
        finally:
            box.close()
    except Exception as exc:  # noqa: BLE001 - any failure means: skip with the reason
        return f"the bwrap sandbox does not run here: {exc}"
    if "ok" not in result.stdout:
        return f"the bwrap sandbox does not run here: {result.summary()}"
    return None


def straggler_report(settings: dict[str, Any], trl_runs: list[H.PolicyResult]) -> dict[str, Any]:
    """The bound computed from the latency distribution: per step, a lock-step batch waits
    E[max of n draws] at each turn; observed turn counts from the TRL runs where available."""
    from envs.wrappers.latency import straggler_bound

    dist = latency_distribution(settings)
    batch = settings["group_size"] * settings["groups_per_step"]
    bound = straggler_bound(dist, batch, settings["max_turns"])
    per_step = [
        turns for p in trl_runs for turns in (p.extra.get("active_per_turn") or []) if turns
    ]
    if per_step:
        observed = [
            straggler_bound(dist, batch, active=t)["lockstep_wait_per_step_s"] for t in per_step
        ]
        bound["lockstep_wait_per_step_observed_turns_s"] = sum(observed) / len(observed)
        bound["mean_active_per_turn"] = [
            sum(t[i] for t in per_step if len(t) > i) / len(per_step)
            for i in range(max(len(t) for t in per_step))
        ]
    bound["distribution"] = dist.describe()
    # Little's law: episodes in flight needed so the tool waits alone sustain one trainer step per
    # `step_s` seconds (mean turns x mean delay per episode, times episodes per second).
    turns = bound.get("mean_active_per_turn")
    mean_turns = (sum(turns) / batch) if turns else settings["max_turns"]
    bound["mean_tool_time_per_episode_s"] = mean_turns * dist.mean()
    return bound


def print_report(summary: dict[str, Any], runs: list[H.RunResult]) -> None:
    sp = H.spread_text
    rows = []
    for s, d in summary["systems"].items():
        rows.append(
            [
                s,
                str(d["runs"]),
                sp(d["train_s"], "{:.0f}", "s"),
                sp(d["samples_per_s"], "{:.1f}"),
                sp(d["acc_before"], "{:.3f}"),
                sp(d["final_acc"], "{:.3f}"),
                sp(d["time_to_trl_final_acc_s"], "{:.0f}", "s")
                + f" ({d['time_to_trl_final_acc_reached']}/{d['runs']})",
                sp(d["trainer_idle"], "{:.2f}"),
                sp(d["episodes_in_flight"]["mean"], "{:.0f}")
                + " / "
                + sp(d["episodes_in_flight"]["max"], "{:.0f}"),
            ]
        )
    H.console.print(
        H.table(
            "Agentic multi-turn math with long-tailed tool latency (median [min–max] over seeds; "
            f"time to TRL's final accuracy {H.fmt(summary['trl_final_acc'], '{:.3f}')})",
            [
                "system",
                "runs",
                "train",
                "samples/s",
                "acc before",
                "acc final",
                "time to TRL acc",
                "trainer idle",
                "in flight mean / max",
            ],
            rows,
        )  # fmt: skip
    )
    H.console.print(
        f"speed-up to TRL's final accuracy: async over TRL "
        f"[bold]{H.fmt(summary['speedup_vs_trl'], '{:.2f}', 'x')}[/] (target >= 3x), "
        f"async over sync [bold]{H.fmt(summary['speedup_async_over_sync'], '{:.2f}', 'x')}[/] "
        f"(target >= 2x), sync over TRL {H.fmt(summary['speedup_sync_vs_trl'], '{:.2f}', 'x')}; "
        f"samples/s async / TRL {H.fmt(summary['samples_per_s_async_over_trl'], '{:.1f}', 'x')}"
    )
    b = summary["straggler"]
    dist = b["distribution"]
    H.console.print(
        f"straggler bound ({dist['distribution']}, p50 {dist['p50_s']:.2f}s, p99 "
        f"{dist['p99_s']:.2f}s, mean {dist['mean_s']:.2f}s): over a batch of {b['batch']} calls "
        f"the slowest takes E\\[max] = {b['expected_max_s']:.2f}s (median {b['median_max_s']:.2f}s), "
        f"{b['tail_ratio']:.1f}x the mean; lock-step pays up to "
        f"{b['lockstep_wait_per_step_s']:.1f}s per step for {b['turns']} turns"
        + (
            f", {b['lockstep_wait_per_step_observed_turns_s']:.1f}s with TRL's observed turns "
            f"(episodes active per turn {', '.join(f'{x:.0f}' for x in b['mean_active_per_turn'])})"
            if "lockstep_wait_per_step_observed_turns_s" in b
            else ""
        )
    )
    trl = summary["systems"].get("trl")
    if trl and trl["env_wait_s_per_step"]["median"] is not None:
        H.console.print(
            f"TRL measured: {trl['env_wait_s_per_step']['median']:.1f}s of tool wait and "
            f"{trl['generate_s_per_step']['median']:.1f}s of rollout (generation + tools) per step"
        )
    systems = summary["systems"]
    H.print_ladder(
        "median seconds to reach each held-out accuracy ('-' = not reached by half the seeds)",
        list(systems),
        {
            lvl: {s: d["time_to_acc"].get(lvl) for s, d in systems.items()}
            for lvl in summary.get("ladder") or []
        },
    )
    for s, d in summary["systems"].items():
        if d["drops"]:
            H.console.print(f"[dim]{s} dropped samples by reason (per run): {d['drops']}[/]")
    H.print_failures(runs, NOTES)


def plot(runs: list[H.RunResult], path: Path) -> Path | None:
    return H.plot_accuracy(
        runs, path, COLOURS, "Multi-turn math, long-tailed tool latency: one line per seed",
        "seconds since training start (evaluation pauses excluded; symlog)", symlog=True,
        marker="o", ms=3,
    )  # fmt: skip


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--quick", action="store_true", help="math case, 1 seed, few steps (under 3 minutes)"
    )
    ap.add_argument(
        "--cases",
        default=None,
        help=f"comma-separated, some of {', '.join(CASES)} (default: math with --quick, else both)",
    )
    ap.add_argument("--sandbox-steps", type=int, default=None, help="steps of the sandbox case")
    ap.add_argument("--sandbox-seeds", type=int, default=1, help="seeds of the sandbox case")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--plot", type=Path, default=None, help="PNG of accuracy against time")
    ap.add_argument("--from-json", type=Path, default=None, help="re-analyse a saved --json")
    ap.add_argument("--seeds", type=int, default=None, help="seeds per system (default 3)")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps")
    ap.add_argument("--eval-every", type=int, default=None, help="evaluate every k steps")
    ap.add_argument("--eval-tasks", type=int, default=None, help="held-out problems per eval")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset")
    ap.add_argument("--trl-threads", type=int, default=2, help="torch threads of the TRL run")
    ap.add_argument("--timeout", type=float, default=None, help="per-run limit in seconds")
    ap.add_argument("--workdir", type=Path, default=None, help="keep runs here (default: temp)")
    ap.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="recipe override for every system (e.g. tasks.env_latency.p99_s=2)",
    )
    ap.add_argument(
        "--af-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="recipe override for the AstraFlow runs only (tuning; recorded in the results)",
    )
    T.add_worker_args(ap)
    ns = ap.parse_args(argv)
    if ns.trl_worker:
        trl_worker(ns)
        return 0

    settings = recipe_settings(ns.sets)
    seeds = ns.seeds or (1 if ns.quick else 3)
    steps = ns.steps or (QUICK_STEPS if ns.quick else STEPS)
    eval_every = ns.eval_every or (1 if ns.quick else EVAL_EVERY)
    eval_tasks = ns.eval_tasks or (100 if ns.quick else EVAL_TASKS)
    timeout = ns.timeout or (300.0 if ns.quick else 1200.0)
    systems = H.parse_systems(ap, ns.systems, SYSTEMS)
    cases = [c.strip() for c in (ns.cases or ("math" if ns.quick else "math,sandbox")).split(",")]
    if set(cases) - set(CASES):
        ap.error(f"--cases: unknown {sorted(set(cases) - set(CASES))}; expected {', '.join(CASES)}")
    sandbox_steps = ns.sandbox_steps or (QUICK_STEPS if ns.quick else SANDBOX_STEPS)
    sandbox_settings: dict[str, Any] | None = None
    sandbox_skipped: str | None = None
    if "sandbox" in cases and not ns.from_json:
        sandbox_skipped = sandbox_unavailable()
        if sandbox_skipped is None:
            sandbox_settings = recipe_settings(ns.sets, CODE_RECIPE)
            sandbox_settings.update(max_steps=sandbox_steps, eval_tasks=0,
                                    seeds=ns.sandbox_seeds, overrides=list(ns.sets))  # fmt: skip
        else:
            H.console.print(f"[yellow]sandbox case skipped: {sandbox_skipped}[/]")
    settings.update(max_steps=steps, eval_every=eval_every, eval_tasks=eval_tasks, seeds=seeds)
    settings["overrides"] = list(ns.sets)
    settings["astraflow_extra_overrides"] = list(ns.af_set)

    runs: list[H.RunResult] = []
    sandbox_runs: list[H.RunResult] = []
    if ns.from_json:
        saved = json.loads(ns.from_json.read_text())
        runs = [H.RunResult.from_json(r) for r in saved["runs"]]
        settings = saved["settings"]
        saved_sandbox = saved.get("sandbox") or {}
        sandbox_runs = [H.RunResult.from_json(r) for r in saved_sandbox.get("runs") or []]
        sandbox_settings = saved_sandbox.get("settings")
        sandbox_skipped = saved_sandbox.get("skipped")
        seeds = 0
    if "math" not in cases:
        seeds = 0
    extra = [*ns.sets, *ns.af_set]
    with H.bench_workdir(ns.workdir, "astraflow-agentic-") as workdir:
        # one case, one system, one seed: the TRL worker or an AstraFlow run of the case's recipe
        def run(case, system, seed, steps, every, tasks, case_settings) -> H.RunResult:
            if system == "trl":
                return run_trl(seed, steps, every, tasks, ns.trl_threads, workdir, timeout,
                               case_settings, case=case)  # fmt: skip
            return run_astraflow(system.removeprefix("astraflow_"), seed, steps, every, tasks,
                                 workdir, timeout, case_settings, extra, case=case)  # fmt: skip

        accuracy = _train_and("final accuracy", "accuracy_final", "{:.3f}")
        throughput = _train_and("samples/s", "samples_per_s", "{:.1f}")
        for seed in range(seeds):
            for system in systems:
                label = f"{system} seed {seed} ({steps} steps, eval every {eval_every})"
                job = partial(run, "math", system, seed, steps, eval_every, eval_tasks, settings)
                runs.append(H.run_logged(label, job, accuracy))
        for seed in range(ns.sandbox_seeds if sandbox_settings and not ns.from_json else 0):
            for system in systems:
                label = f"sandbox {system} seed {seed} ({sandbox_steps} steps)"
                job = partial(run, "sandbox", system, seed, sandbox_steps, 1, 0, sandbox_settings)
                sandbox_runs.append(H.run_logged(label, job, throughput))
        summary = analyse(runs, settings) if runs else {}
        if runs:
            print_report(summary, runs)
        sandbox: dict[str, Any] | None = None
        if sandbox_runs:
            sandbox = analyse_sandbox(sandbox_runs, sandbox_settings or {})
            print_sandbox_report(sandbox, sandbox_runs)
        elif sandbox_skipped:
            sandbox = {"skipped": sandbox_skipped}
            H.console.print(f"[yellow]sandbox case skipped: {sandbox_skipped}[/]")
        plotted = H.plot_safely(lambda: plot(runs, ns.plot)) if ns.plot and runs else None
        if ns.json:
            payload = {
                "benchmark": "agentic",
                "quick": ns.quick,
                "settings": settings | {"trl_threads": ns.trl_threads, "astraflow_threads": 1},
                **summary,
                # flat per-system figures: <system>.train_s, .samples_per_s, .final_acc, ...
                **{
                    s: {
                        "train_s": d["train_s"]["median"],
                        "samples_per_s": d["samples_per_s"]["median"],
                        "final_acc": d["final_acc"]["median"],
                        "trainer_idle": d["trainer_idle"]["median"],
                        "episodes_in_flight": {
                            "mean": d["episodes_in_flight"]["mean"]["median"],
                            "max": d["episodes_in_flight"]["max"]["median"],
                        },
                        "time_to_acc": d["time_to_acc"],
                    }
                    for s, d in summary.get("systems", {}).items()
                },
                "notes": NOTES,
                "plot": str(plotted) if plotted else None,
                "runs": [r.to_json() for r in runs],
            }
            if sandbox is not None:
                payload["sandbox"] = sandbox | {"runs": [r.to_json() for r in sandbox_runs]}
            H.write_json(ns.json, payload)
            H.console.print(f"wrote {ns.json}")
    return 0 if all(r.ok for r in [*runs, *sandbox_runs]) else 1


def _train_and(label: str, attr: str, spec: str) -> Callable[[H.PolicyResult | None], str]:
    """A run's outcome figures: its training seconds and its ``attr`` (e.g. final accuracy)."""

    def figures(pol: H.PolicyResult | None) -> str:
        return (
            f"train {H.fmt(pol.train_s if pol else None, '{:.0f}', 's')}, {label} "
            f"{H.fmt(getattr(pol, attr) if pol else None, spec)}"
        )

    return figures


if __name__ == "__main__":
    sys.exit(main())
