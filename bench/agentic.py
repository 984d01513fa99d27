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

Headline, declared in code before a run (:class:`Declared`, one frozen dataclass: seeds, run size,
target, sustained window, ladder, wall-clock budgets, non-inferiority margin; its hash is the JSON's
``declared_hash``): time to the start accuracy + 0.03 *sustained* (the mean of two consecutive
evaluations at or above it), seeds paired, every seed counted (both reached / only the system /
only the baseline / neither): ``speedup_vs_trl_sustained``, ``speedup_async_over_sync_sustained``
and their ``*_paired`` tables; beside it ``target_ladder`` (start + 0.01, 0.02, 0.03 and the
baselines' median final accuracy), ``acc_at_equal_wallclock`` and ``final_acc_at_equal_samples``
(against the declared margin); ``failed_runs`` lists every failed or timed-out run. A stored
file is re-analysed from its per-seed curves, nothing run, with ``--reanalyse JSON``.

Earlier figures, kept beside the declared ones: time to the first evaluation at or above the start
accuracy + 0.03 (first crossing) and to a fixed ladder of held-out accuracies (0.20-0.40; greedy, first answer, on the arith test split, evaluated
by the bench off every system's clock as in ``vs_trl.py``), with seeds paired: per-seed speed-ups
(geometric mean, 95 % interval) and the final-accuracy gap async minus sync at equal trained
samples (mean, 95 % interval); keys ``speedup_vs_trl``, ``speedup_async_over_sync`` (ratios of
censored median times to the target), ``final_acc_gap_async_vs_sync`` and its ``_ci95``, the
paired details under ``*_paired``. Also samples/s, trainer idle
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

A third case (``--cases tools``; part of the full run) is function calling with TRL's *own* tool
loop: ``recipes/agentic_tools.toml``, the built-in tiny tools policy (``builtin:tiny-tools``)
calling a ``calculator`` in the hermes format (``<tool_call>{json}</tool_call>``) on 3-digit
products, one turn to call and one to answer, every tool call behind the same latency
distribution (``[tasks.env_latency]``, ``on = ["tool_calls"]``: the calls wait, the final answer's
grading does not). TRL runs ``GRPOTrainer(tools=[calculator])`` (``_trl_tools.py``): its chat
template rendering with ``tools=``, its ``parse_response`` (the tokenizer's ``response_template``
for the hermes format, set by the bench because TRL's ``add_response_schema`` knows only published
templates), its ``_tool_call_loop`` (``max_tool_calling_iterations = max_turns - 1``) and an async
tool that waits the drawn delay. TRL 1.16's loop awaits one sample's calls before the next
sample's, so its tool time per step is the sum of the batch's delays; that is the loop as shipped,
not a bench choice. Differences left: TRL caps a whole completion at ``max_tokens x max_turns``
(200) where AstraFlow caps each turn at ``max_tokens`` (100); an unknown tool's error text differs
(TRL ``{'error': 'Tool calc not found.'}``, AstraFlow ``error: no tool named 'calc'``).
Reported per system: samples/s, training time, held-out success before and after (sampled
episodes at the recipe's temperature 1.0, ``eval_samples`` per problem, played as the
``tool_agent`` workflow plays them, off every clock: what RL moves, see ``tool_learning.py``),
trainer idle, the tool wait per step; ``tools.speedup_vs_trl`` and ``tools.speedup_async_over_sync``
are ratios of samples/s at equal trained samples (= ratios of training times), medians over seeds.
JSON: ``tools.<system>.final_acc``, ``tools.<system>.samples_per_s``, ...

The full run (8 seeds x 20 steps x 3 systems) takes ~2.5 hours on two cores; ``--journal PATH``
keeps the finished runs so a rerun skips them.

    python bench/agentic.py --quick --json /tmp/agentic.json        # math, 1 seed, ~2.5 min
    python bench/agentic.py --json /tmp/agentic.json --plot /tmp/agentic.png  # 8 seeds x 20 steps
    python bench/agentic.py --cases sandbox --json /tmp/agentic-sandbox.json
    python bench/agentic.py --quick --cases tools --json /tmp/agentic-tools.json  # ~6 min
    python bench/agentic.py --reanalyse docs/results/agentic.json  # declared figures, no run

A headline ``--json`` (not ``--quick``) is refused from a tree with uncommitted changes unless
``--allow-dirty``, which the JSON records (``allow_dirty``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
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
import _trl_tools

RECIPE = _runs.REPO_ROOT / "recipes" / "agentic_math.toml"
CODE_RECIPE = _runs.REPO_ROOT / "recipes" / "agentic_code.toml"
TOOLS_RECIPE = _runs.REPO_ROOT / "recipes" / "agentic_tools.toml"
RECIPES = {"math": RECIPE, "sandbox": CODE_RECIPE, "tools": TOOLS_RECIPE}
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
# the full run, 8 seeds x 20 steps, takes ~2.5 hours on a quiet 2-core machine. 20 steps keep the
# first steps (a pipeline filling up) a small part of the run; 8 seeds paired by seed give the
# intervals. 500 held-out problems keep one evaluation's standard error near 0.02.
# --quick (math, 1 seed, 2 steps, 100 problems) takes ~2.5 minutes and writes every key (the
# intervals need two seeds or more, the target a run long enough to reach it).
STEPS = 20
EVAL_EVERY = 4
EVAL_TASKS = 500
SEEDS = 8
SANDBOX_STEPS = 6
# The tools case: 20 steps (tool_learning.py's quick run shows the gain by then), 3 seeds,
# evaluations at 0, 10 and 20 on 200 held-out problems x 2 sampled episodes. One TRL step waits
# ~64 delays in sequence (~40 s); --quick: 2 steps, 1 seed, 50 problems x 2, start and end only.
TOOLS_STEPS = 20
TOOLS_SEEDS = 3
TOOLS_EVAL_EVERY = 10
TOOLS_EVAL_TASKS = 200
TOOLS_EVAL_SAMPLES = 2
QUICK_STEPS = 2
#: The fixed accuracy ladder every system is timed to (held-out greedy first answer).
LADDER = tuple(round(0.20 + 0.01 * i, 2) for i in range(21))
#: The headline target: the start accuracy plus this, fixed before any run (the start is the
#: same checkpoint for every system). Not a point of any system's result distribution.
TARGET_GAIN = 0.03


@dataclass(frozen=True)
class Declared:
    """The math case's headline, fixed in code before a run: seeds, run size, targets, the
    sustained criterion, the ladder, the wall-clock budgets and the non-inferiority margin. Its
    hash goes into the JSON (``declared_hash``), so a figure names the rules it was computed
    under, and changing a rule changes the hash (and needs a decisions entry).

    * headline: ``speedup_vs_trl_sustained``, time to ``start + target_gain`` *sustained* (the
      mean of ``sustained_window`` consecutive evaluations at or above it,
      :func:`_stats.time_to_sustained`), TRL over AstraFlow async, seeds paired; censoring
      counted both ways (``only_system`` / ``only_baseline``).
    * ladder: ``start + g`` for each of ``ladder_gains`` and the median final accuracy of each
      system of ``ladder_baseline_finals`` (the level "as good as the baseline ends").
    * accuracy at equal wall clock: at each system of ``wallclock_budgets``' median training
      time, every system's last evaluation by then.
    * final accuracy at equal trained samples: paired differences against
      ``noninferiority_margin`` (one evaluation's standard error on 500 problems is ~0.02)."""

    recipe: str = "recipes/agentic_math.toml"
    systems: tuple[str, ...] = SYSTEMS
    seeds: int = SEEDS
    steps: int = STEPS
    eval_every: int = EVAL_EVERY
    eval_tasks: int = EVAL_TASKS
    target_gain: float = TARGET_GAIN
    sustained_window: int = 2
    ladder_gains: tuple[float, ...] = (0.01, 0.02, 0.03)
    ladder_baseline_finals: tuple[str, ...] = ("trl", "astraflow_sync")
    pairs: tuple[tuple[str, str], ...] = (
        ("trl", "astraflow_async"),
        ("astraflow_sync", "astraflow_async"),
        ("trl", "astraflow_sync"),
    )
    wallclock_budgets: tuple[str, ...] = SYSTEMS
    noninferiority_margin: float = 0.02
    headline: str = "speedup_vs_trl_sustained"

    def as_json(self) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(self)))

    def digest(self) -> str:
        """sha256 of the declared settings (sorted JSON), first 16 hex digits."""
        text = json.dumps(self.as_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


DECLARED = Declared()


# ----------------------------------------------------------------------------- settings


def recipe_settings(
    overrides: list[str] | None = None, recipe_path: Path = RECIPE
) -> dict[str, Any]:
    """The shared hyper-parameters, read from the recipe itself (after ``overrides``)."""
    from astraflow.recipe import load_recipe

    recipe = load_recipe(recipe_path, overrides or [])
    latency = recipe.tasks.env_latency
    return T.grpo_settings(recipe) | {
        "tool_parser": recipe.policies[recipe.workflow.roles["agent"]].tool_parser,
        "max_turns": recipe.workflow.max_turns,
        "env_latency": latency.model_dump() if latency is not None else None,
        "concurrency": recipe.rollout.concurrency,
        "env_workers": recipe.rollout.env_workers,
        "buffer_steps": recipe.dataflow.buffer_steps,
        "max_lag": recipe.dataflow.max_lag,
    }


def latency_distribution(settings: dict[str, Any]):
    from astraflow.envs.wrappers.latency import LatencyDistribution

    cfg = dict(settings["env_latency"] or {"distribution": "fixed", "value_s": 0.0})
    return LatencyDistribution.from_config(
        {k: v for k, v in cfg.items() if k not in ("on", "inner", "seed")}
    )


# ----------------------------------------------------------------------------- TRL worker


def trl_worker(ns: argparse.Namespace) -> None:
    """Stock ``trl.GRPOTrainer`` with a multi-turn ``rollout_func``; AstraFlow-format metrics.
    The tools case runs TRL's own tool loop instead (:func:`_trl_tools.trl_tools_worker`)."""
    if json.loads(ns.settings).get("case") == "tools":
        _trl_tools.trl_tools_worker(ns)
        return
    import asyncio
    import copy
    from concurrent.futures import ThreadPoolExecutor

    import torch
    from astraflow.envs import make_env
    from astraflow.envs.wrappers.latency import LatencyEnvFactory

    from astraflow.rollout.workflows.tokens import ChatRenderer

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
        """One batched sampling call, as TRL's own transformers path does it, capped at the
        recipe's ``max_tokens`` per turn (TRL's ``max_completion_length`` is the episode's)."""
        ids, mask = _evaluation.left_pad(seqs, tokenizer.pad_token_id)
        width = ids.shape[1]
        unwrapped = trainer.accelerator.unwrap_model(trainer.model)
        per_turn = copy.deepcopy(trainer.generation_config)
        per_turn.max_new_tokens = cfg["max_tokens"]
        with torch.no_grad():
            full = unwrapped.generate(
                input_ids=ids, attention_mask=mask, generation_config=per_turn
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
) -> _results.RunResult:  # fmt: skip
    return T.run_worker(
        Path(__file__), "trl", seed, steps, eval_every, eval_tasks, threads,
        workdir / f"{case}-trl-s{seed}", workdir / f"{case}-trl-s{seed}.log", timeout_s, settings,
        env={"TRL_EXPERIMENTAL_SILENCE": "1"},
        extras=_trl_tools_extras if case == "tools" else _trl_extras,
    )  # fmt: skip


def _trl_extras(
    res: _results.PolicyResult, steps_recs: list[dict[str, Any]], info: dict[str, Any]
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


def _trl_tools_extras(
    res: _results.PolicyResult, steps_recs: list[dict[str, Any]], info: dict[str, Any]
) -> None:
    """The tools case's TRL figures: tool wait per step (its calls run one after another, so the
    sum of their delays) and calls per step, and the delays drawn."""
    if steps_recs:
        last = steps_recs[-1]
        res.extra["env_wait_s_per_step"] = float(last["env_wait_s_total"]) / len(steps_recs)
        res.extra["tool_calls_per_step"] = float(last["tool_calls_total"]) / len(steps_recs)
    res.extra["tool_delays_s"] = info.get("tool_delays_s") or []


# ----------------------------------------------------------------------------- AstraFlow


def lease_occupancy(
    summary: dict[str, Any] | None, t_start: float, t_end: float
) -> tuple[float | None, int | None, dict[str, int]]:
    """Episodes in flight on the rollout nodes over [t_start, t_end], from the run's
    ``run_summary`` record (what the dataflow wrote to metrics.jsonl as it stopped).

    A training lease holds its group's episodes from when it was issued until the node pushes
    them. Returns the time-weighted mean, the maximum, and the drop counts by ``policy:reason``
    (what the dataflow policies discarded, e.g. samples past the staleness bound)."""
    if summary is None or t_end <= t_start:
        return None, None, {}
    rows = [(issued, pushed, n) for _, issued, pushed, n in summary.get("leases", [])]
    drops = {
        f"{p}:{r}": int(c)
        for p, doc in ((summary.get("status") or {}).get("policies") or {}).items()
        for r, c in (doc.get("dropped") or {}).items()
    }
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
    node stored it) and the episodes' returns: a per-episode figure no run summary carries, read
    from the finished run's store through the dataflow's storage functions (no SQL here)."""
    from astraflow.dataflow.storage import episodes, store

    if not Path(db_path).exists():
        return [], []
    with store.read_only(db_path) as tx:
        rows = episodes.training_outcomes(tx)
    durations, returns = [], []
    for row in rows:
        info = json.loads(row.info or "{}") or {}
        run = (info.get("info") or info).get("sandbox")  # the env's info, as the node nests it
        if isinstance(run, dict) and isinstance(run.get("duration_s"), (int, float)):
            durations.append(float(run["duration_s"]))
        returns += [float(v) for v in (json.loads(row.rewards or "{}") or {}).values()]
    return durations, returns


def run_astraflow(
    mode: str, seed: int, steps: int, eval_every: int, eval_tasks: int, workdir: Path,
    timeout_s: float, settings: dict[str, Any], extra: list[str], case: str = "math",
) -> _results.RunResult:  # fmt: skip
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
    result = _runs.run_recipe(
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
            summary = _records.run_summary(_records.read_jsonl(run_dir / "metrics.jsonl"))
            mean, peak, drops = lease_occupancy(summary, result.t0, result.t0 + res.train_s)
            res.extra["episodes_in_flight_mean"] = mean
            res.extra["episodes_in_flight_max"] = peak
            res.extra["drops"] = drops
    return result


# ----------------------------------------------------------------------------- analysis


def analyse(runs: list[_results.RunResult], settings: dict[str, Any]) -> dict[str, Any]:
    """Per-system figures over seeds, and the race to the fixed target paired by seed.

    The target is set before any run from the start accuracy (the median step-0 evaluation, the
    same checkpoint for every system) plus :data:`TARGET_GAIN`; the ladder is :data:`LADDER`.
    Speed-ups are the ratio of censored median times to the target (a seed that never reaches it
    ranks last), with the per-seed ratios' geometric mean and 95 % interval where both systems of
    a seed reached it. Final accuracies are at equal trained samples (every system trains the same
    steps of the same batch size), compared per seed: async minus sync, mean and 95 % interval.
    """
    ok = _results.successful_runs(runs, SYSTEMS)
    by_seed = {s: {r.seed: r.policies["policy"] for r in rs} for s, rs in ok.items()}
    by_system = {s: list(d.values()) for s, d in by_seed.items()}
    before = _stats.spread(p.accuracy_before for ps in by_system.values() for p in ps).median
    target = round(before + TARGET_GAIN, 4) if before is not None else None
    tta = {
        s: {k: _records.time_to_accuracy(p.evals, target) if target else None for k, p in d.items()}
        for s, d in by_seed.items()
    }
    systems: dict[str, Any] = {}
    for s, ps in by_system.items():
        systems[s] = {
            **_results.throughput_json(ok[s]),
            "trained_samples": _stats.spread_json(_stats.spread(p.trained_samples for p in ps)),
            "acc_before": _stats.spread_json(_stats.spread(p.accuracy_before for p in ps)),
            "final_acc": _stats.spread_json(_stats.spread(p.accuracy_final for p in ps)),
            "final_acc_mean_sd": _stats.paired(p.accuracy_final for p in ps),
            "trainer_idle": _stats.spread_json(_stats.spread(p.idle_fraction for p in ps)),
            "episodes_in_flight": {
                "mean": _stats.spread_json(
                    _stats.spread(p.extra.get("episodes_in_flight_mean") for p in ps)
                ),
                "max": _stats.spread_json(
                    _stats.spread(p.extra.get("episodes_in_flight_max") for p in ps)
                ),
            },
            "time_to_target_s": _stats.spread_json(_stats.censored_spread(list(tta[s].values()))),
            "time_to_target_reached": sum(t is not None for t in tta[s].values()),
            "time_to_acc": {
                f"{lvl:.2f}": _stats.censored_spread(
                    [_records.time_to_accuracy(p.evals, lvl) for p in ps]
                ).median
                for lvl in LADDER
            },
            "env_wait_s_per_step": _stats.spread_json(
                _stats.spread(p.extra.get("env_wait_s_per_step") for p in ps)
            ),
            "generate_s_per_step": _stats.spread_json(
                _stats.spread(p.extra.get("generate_s_per_step") for p in ps)
            ),
            "staleness_mean": _stats.spread_json(
                _stats.spread(p.extra.get("staleness_mean") for p in ps)
            ),
            "drops": [p.extra.get("drops") for p in ps if p.extra.get("drops") is not None],
        }

    def common(a: str, b: str) -> list[int]:
        return sorted(set(by_seed.get(a, {})) & set(by_seed.get(b, {})))

    def paired_speedup(baseline: str, system: str) -> dict[str, Any]:
        seeds = common(baseline, system)
        return _stats.paired_speedup(
            [tta[baseline][k] for k in seeds], [tta[system][k] for k in seeds]
        )

    gap = _stats.paired(
        by_seed["astraflow_async"][k].accuracy_final - by_seed["astraflow_sync"][k].accuracy_final
        for k in common("astraflow_async", "astraflow_sync")
        if by_seed["astraflow_async"][k].accuracy_final is not None
        and by_seed["astraflow_sync"][k].accuracy_final is not None
    )
    med = {s: systems[s]["time_to_target_s"]["median"] for s in systems}
    return {
        "accuracy_before": before,
        "target_acc": target,
        "target_gain": TARGET_GAIN,
        "ladder": [f"{lvl:.2f}" for lvl in LADDER],
        "systems": systems,
        "speedup_vs_trl": _stats.ratio(med.get("trl"), med.get("astraflow_async")),
        "speedup_vs_trl_paired": paired_speedup("trl", "astraflow_async"),
        "speedup_async_over_sync": _stats.ratio(
            med.get("astraflow_sync"), med.get("astraflow_async")
        ),
        "speedup_async_over_sync_paired": paired_speedup("astraflow_sync", "astraflow_async"),
        "speedup_sync_vs_trl": _stats.ratio(med.get("trl"), med.get("astraflow_sync")),
        "final_acc_gap_async_vs_sync": gap["mean"],
        "final_acc_gap_async_vs_sync_ci95": gap["ci95"],
        "final_acc_gap_async_vs_sync_paired": gap,
        "samples_per_s_async_over_trl": _stats.ratio(
            systems.get("astraflow_async", {}).get("samples_per_s", {}).get("median"),
            systems.get("trl", {}).get("samples_per_s", {}).get("median"),
        ),
        "straggler": straggler_report(settings, by_system.get("trl", [])),
    }


def analyse_declared(
    runs: list[_results.RunResult], declared: Declared = DECLARED
) -> dict[str, Any]:
    """The declared headline and everything beside it (:class:`Declared`), from the runs'
    evaluation curves alone (so stored runs can be re-analysed without running them again).

    Only seeds every system finished are raced (paired by seed); a seed some system failed is
    listed under ``seeds_unpaired``."""
    ok = _results.successful_runs(runs, declared.systems)
    by_seed = {s: {r.seed: r.policies["policy"] for r in rs} for s, rs in ok.items()}
    present = [s for s in declared.systems if by_seed.get(s)]
    seeds = sorted(set.intersection(*(set(by_seed[s]) for s in present))) if present else []
    unpaired = sorted({k for s in present for k in by_seed[s]} - set(seeds))
    curves = {s: [by_seed[s][k].evals for k in seeds] for s in present}
    before = _stats.spread(by_seed[s][k].accuracy_before for s in present for k in seeds).median
    target = round(before + declared.target_gain, 4) if before is not None else None
    window = declared.sustained_window
    pairs = [(b, s) for b, s in declared.pairs if b in curves and s in curves]

    def finals(s: str) -> list[float | None]:
        return [by_seed[s][k].accuracy_final for k in seeds]

    levels: dict[str, float] = {}
    if before is not None:
        for g in declared.ladder_gains:
            levels[f"start+{g:.2f}"] = round(before + g, 4)
    for s in declared.ladder_baseline_finals:
        med = _stats.spread(finals(s)).median if s in curves else None
        if med is not None:
            levels[f"{s} median final"] = round(med, 4)
    ladder = _stats.target_ladder(curves, levels, pairs, window) if curves else {}

    times = {
        s: [_stats.time_to_sustained(c, target, window) if target else None for c in curves[s]]
        for s in present
    }
    med = {s: _stats.censored_spread(ts).median for s, ts in times.items()}

    def speedup(base: str, system: str) -> tuple[float | None, dict[str, Any] | None]:
        if base not in times or system not in times:
            return None, None
        return _stats.ratio(med[base], med[system]), _stats.paired_speedup(
            times[base], times[system]
        )

    budgets = {
        f"{s} median training time": _stats.spread(by_seed[s][k].train_s for k in seeds).median
        for s in declared.wallclock_budgets
        if s in curves
    }
    budgets = {k: v for k, v in budgets.items() if v is not None}

    def diffs(a: str, b: str) -> list[float | None]:
        return [
            None if x is None or y is None else x - y
            for x, y in zip(finals(a), finals(b), strict=True)
        ]

    margin = declared.noninferiority_margin
    equal_samples = {
        f"{s}_minus_{b}": _stats.non_inferiority(diffs(s, b), margin) for b, s in pairs
    }
    out: dict[str, Any] = {
        "declared": declared.as_json(),
        "declared_hash": declared.digest(),
        "seeds_paired": seeds,
        "seeds_unpaired": unpaired,
        "target_acc_sustained": target,
        "time_to_target_sustained_s": {
            s: _stats.spread_json(_stats.censored_spread(ts))
            | {"reached": sum(t is not None for t in ts)}
            for s, ts in times.items()
        },
        "target_ladder": ladder,
        "acc_at_equal_wallclock": _stats.acc_at_equal_wallclock(curves, budgets, pairs),
        "final_acc_at_equal_samples": equal_samples,
    }
    for key, (base, system) in {
        "speedup_vs_trl_sustained": ("trl", "astraflow_async"),
        "speedup_async_over_sync_sustained": ("astraflow_sync", "astraflow_async"),
        "speedup_sync_vs_trl_sustained": ("trl", "astraflow_sync"),
    }.items():
        out[key], out[f"{key}_paired"] = speedup(base, system)
    return out


def first_crossing_paired(runs: list[_results.RunResult], target: float | None) -> dict[str, Any]:
    """The earlier metric's paired tables (time to the first evaluation at or above ``target``),
    recounted with censoring both ways: ``speedup_vs_trl_paired`` and
    ``speedup_async_over_sync_paired`` as :func:`analyse` writes them, plus ``only_baseline``."""
    ok = _results.successful_runs(runs, SYSTEMS)
    by_seed = {s: {r.seed: r.policies["policy"] for r in rs} for s, rs in ok.items()}

    def tta(s: str, k: int) -> float | None:
        return _records.time_to_accuracy(by_seed[s][k].evals, target) if target else None

    def paired(base: str, system: str) -> dict[str, Any]:
        seeds = sorted(set(by_seed.get(base, {})) & set(by_seed.get(system, {})))
        return _stats.paired_speedup([tta(base, k) for k in seeds], [tta(system, k) for k in seeds])

    return {
        "speedup_vs_trl_paired": paired("trl", "astraflow_async"),
        "speedup_async_over_sync_paired": paired("astraflow_sync", "astraflow_async"),
        "speedup_sync_vs_trl_paired": paired("trl", "astraflow_sync"),
    }


def failed_runs(
    runs: dict[str, list[_results.RunResult]], journal: _results.RunJournal | None = None
) -> list[dict[str, Any]]:
    """Every failed or timed-out run, for the JSON: the ones of this invocation (``runs`` by
    case) and, with a journal, every failed attempt it recorded (a run retried later keeps its
    failures here)."""
    seen: list[dict[str, Any]] = [] if journal is None else list(journal.failures)
    for case, rs in runs.items():
        for r in rs:
            if r.ok:
                continue
            entry = _results.failure_entry(case, r)
            if entry not in seen:
                seen.append(entry)
    return seen


#: The earlier headline metric, kept beside the declared one (see the decisions entry
#: "agentic headline: sustained time to start + 0.03").
PREVIOUS_METRIC = (
    "first crossing: the time of the first evaluation at or above start + 0.03 (speedup_vs_trl, "
    "speedup_async_over_sync: ratios of censored medians; *_paired: per-seed ratios); before it, "
    "time to TRL's final accuracy (not met). Replaced because one lucky evaluation decides it and "
    "seeds where only the baseline reached the target were dropped from the paired table."
)


def reanalyse(path: Path, declared: Declared = DECLARED) -> dict[str, Any]:
    """Recompute the declared figures of a stored ``--json`` file from its per-seed evaluation
    curves (no run), keep its earlier figures beside them, and write it back.

    What is added: :func:`analyse_declared`'s keys, the earlier metric's paired tables recounted
    both ways (:func:`first_crossing_paired`), ``metric_history`` (the earlier headline's figures
    and rule), ``failed_runs`` and a ``reanalysis`` stamp (commit and tree of this analysis; the
    file's ``meta`` still names the runs' commit). ``declared_after_runs`` says that the rules
    were declared after these runs were made: the figures apply them, they were not fixed before
    the data."""
    import _stamp

    data = json.loads(Path(path).read_text())
    runs = [_results.RunResult.from_json(r) for r in data.get("runs") or []]
    new = analyse_declared(runs, declared)
    recount = first_crossing_paired(runs, data.get("target_acc"))
    history = data.get("metric_history") or []
    if not any(h.get("metric") == "first crossing of start + 0.03" for h in history):
        history.append(
            {
                "metric": "first crossing of start + 0.03",
                "rule": PREVIOUS_METRIC,
                "target_acc": data.get("target_acc"),
                "speedup_vs_trl": data.get("speedup_vs_trl"),
                "speedup_async_over_sync": data.get("speedup_async_over_sync"),
                "speedup_sync_vs_trl": data.get("speedup_sync_vs_trl"),
                "replaced_by": declared.headline,
            }
        )
    stamp = _stamp.stamp(["agentic.py", "--reanalyse", str(path)])
    data.update(recount)
    data.update(new)
    data["metric_history"] = history
    data["declared_after_runs"] = True
    data["failed_runs"] = failed_runs({"math": runs})
    data["failed_runs_recorded"] = (
        "Earlier failed attempts are not known: the journal these runs were made with re-ran a "
        "failed run without recording it (it records every failure since issue 43)."
    )
    data["reanalysis"] = {k: stamp[k] for k in ("command", "commit", "dirty", "date")}
    _report.write_json(path, data)
    return data


def quantile(xs: list[float], q: float) -> float | None:
    """Nearest-rank quantile (None for no data)."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))] if xs else None


def analyse_sandbox(runs: list[_results.RunResult], settings: dict[str, Any]) -> dict[str, Any]:
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
            "train_s": _stats.spread(p.train_s for p in ps).median,
            "samples_per_s": _stats.spread(p.samples_per_s for p in ps).median,
            "trained_samples": _stats.spread(p.trained_samples for p in ps).median,
            "trainer_idle": _stats.spread(p.idle_fraction for p in ps).median,
            "episodes_in_flight": {
                "mean": _stats.spread(p.extra.get("episodes_in_flight_mean") for p in ps).median,
                "max": _stats.spread(p.extra.get("episodes_in_flight_max") for p in ps).median,
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
            "staleness_mean": _stats.spread(p.extra.get("staleness_mean") for p in ps).median,
        }

    def sps(system: str) -> float | None:
        return (out.get(system) or {}).get("samples_per_s")

    out["speedup_async_over_sync_samples_per_s"] = _stats.ratio(
        sps("astraflow_async"), sps("astraflow_sync")
    )
    out["speedup_async_over_trl_samples_per_s"] = _stats.ratio(sps("astraflow_async"), sps("trl"))
    return out


def print_sandbox_report(summary: dict[str, Any], runs: list[_results.RunResult]) -> None:
    rows = []
    for s in SYSTEMS:
        d = summary.get(s)
        if not d:
            continue
        call, wall = d["sandbox_call_s"], d["env_call_wall_s"]
        rows.append(
            [
                s,
                _report.fmt(d["train_s"], "{:.0f}", "s"),
                _report.fmt(d["samples_per_s"], "{:.1f}"),
                _report.fmt(d["trainer_idle"], "{:.2f}"),
                _report.fmt(d["episodes_in_flight"]["mean"], "{:.0f}")
                + " / "
                + _report.fmt(d["episodes_in_flight"]["max"], "{:.0f}"),
                f"{_report.fmt(call['p50'], '{:.2f}', 's')} / {_report.fmt(call['p99'], '{:.2f}', 's')}"
                + (f" (wall {wall['p50']:.2f}s / {wall['p99']:.2f}s)" if wall else ""),
                _report.fmt(d["return_mean"], "{:.3f}"),
            ]
        )
    _report.console.print(
        _report.table(
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
    _report.console.print(
        "samples/s: async over sync "
        f"[bold]{_report.fmt(summary['speedup_async_over_sync_samples_per_s'], '{:.2f}', 'x')}[/], "
        f"async over TRL [bold]{_report.fmt(summary['speedup_async_over_trl_samples_per_s'], '{:.2f}', 'x')}[/]"
    )
    for r in runs:
        if not r.ok:
            _report.console.print(f"[red]sandbox {r.system} seed {r.seed} failed:[/] {r.error}")


def sandbox_unavailable() -> str | None:
    """Why the sandbox case cannot run here (None when it can)."""
    import shutil

    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed (apt-get install bubblewrap; .ci/run does)"
    try:
        from astraflow.envs.sandbox import select_backend

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


def straggler_report(
    settings: dict[str, Any], trl_runs: list[_results.PolicyResult]
) -> dict[str, Any]:
    """The bound computed from the latency distribution: per step, a lock-step batch waits
    E[max of n draws] at each turn; observed turn counts from the TRL runs where available."""
    from astraflow.envs.wrappers.latency import straggler_bound

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


def print_report(summary: dict[str, Any], runs: list[_results.RunResult]) -> None:
    sp = _report.spread_text
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
                sp(d["time_to_target_s"], "{:.0f}", "s")
                + f" ({d['time_to_target_reached']}/{d['runs']})",
                sp(d["trainer_idle"], "{:.2f}"),
                sp(d["episodes_in_flight"]["mean"], "{:.0f}")
                + " / "
                + sp(d["episodes_in_flight"]["max"], "{:.0f}"),
            ]
        )
    _report.console.print(
        _report.table(
            "Agentic multi-turn math with long-tailed tool latency (median [min–max] over seeds; "
            f"target {_report.fmt(summary['target_acc'], '{:.3f}')} = start "
            f"{_report.fmt(summary['accuracy_before'], '{:.3f}')} + {summary['target_gain']})",
            [
                "system",
                "runs",
                "train",
                "samples/s",
                "acc before",
                "acc final",
                "time to target",
                "trainer idle",
                "in flight mean / max",
            ],
            rows,
        )  # fmt: skip
    )

    def paired_text(p: dict[str, Any]) -> str:
        if not p["reached"]:
            return "no seed where both reached it"
        ci = p["ci95"]
        return (
            f"per seed {p['geo_mean']:.2f}x"
            + (f" [95% {ci[0]:.2f}-{ci[1]:.2f}x]" if ci else "")
            + f" over {p['reached']} seeds"
            + (f", +{p['only_system']} where only async did" if p["only_system"] else "")
            + (
                f", {p['only_baseline']} where only the baseline did"
                if p.get("only_baseline")
                else ""
            )
        )

    gap = summary["final_acc_gap_async_vs_sync_paired"]
    _report.console.print(
        f"speed-up to the target: async over TRL "
        f"[bold]{_report.fmt(summary['speedup_vs_trl'], '{:.2f}', 'x')}[/] (target >= 3x; "
        f"{paired_text(summary['speedup_vs_trl_paired'])}), async over sync "
        f"[bold]{_report.fmt(summary['speedup_async_over_sync'], '{:.2f}', 'x')}[/] (target >= 2x; "
        f"{paired_text(summary['speedup_async_over_sync_paired'])}), sync over TRL "
        f"{_report.fmt(summary['speedup_sync_vs_trl'], '{:.2f}', 'x')}; samples/s async / TRL "
        f"{_report.fmt(summary['samples_per_s_async_over_trl'], '{:.1f}', 'x')}"
    )
    ci = gap["ci95"]
    _report.console.print(
        f"final accuracy at equal trained samples, async - sync: "
        f"[bold]{_report.fmt(gap['mean'], '{:+.3f}')}[/]"
        + (f" (sd {gap['sd']:.3f}, 95% [{ci[0]:+.3f}, {ci[1]:+.3f}])" if ci else "")
        + f" over {gap['n']} paired seeds"
    )
    b = summary["straggler"]
    dist = b["distribution"]
    _report.console.print(
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
        _report.console.print(
            f"TRL measured: {trl['env_wait_s_per_step']['median']:.1f}s of tool wait and "
            f"{trl['generate_s_per_step']['median']:.1f}s of rollout (generation + tools) per step"
        )
    systems = summary["systems"]
    _report.print_ladder(
        "median seconds to reach each held-out accuracy of the fixed ladder ('-' = not reached by "
        "half the seeds)",
        list(systems),
        {
            lvl: {s: d["time_to_acc"].get(lvl) for s, d in systems.items()}
            for lvl in summary.get("ladder") or []
        },
    )
    for s, d in summary["systems"].items():
        if d["drops"]:
            _report.console.print(f"[dim]{s} dropped samples by reason (per run): {d['drops']}[/]")
    _report.print_failures(runs, NOTES)


def plot(runs: list[_results.RunResult], path: Path) -> Path | None:
    return _plots.plot_accuracy(
        runs, path, COLOURS, "Multi-turn math, long-tailed tool latency: one line per seed",
        "seconds since training start (evaluation pauses excluded; symlog)", symlog=True,
        marker="o", ms=3,
    )  # fmt: skip


def analyse_tools(runs: list[_results.RunResult], settings: dict[str, Any]) -> dict[str, Any]:
    """The tools case per system (medians over seeds) and its speed-ups: every system trains the
    same steps of the same batch, so the ratio of samples/s is the ratio of training times at
    equal trained samples; accuracy at those equal samples is reported beside it."""
    out: dict[str, Any] = {"settings": settings}
    for s in SYSTEMS:
        ps = [
            r.policies["policy"] for r in runs if r.system == s and r.ok and "policy" in r.policies
        ]
        if not ps:
            continue

        def med(values) -> float | None:
            return _stats.spread(values).median

        out[s] = {
            "runs": len(ps),
            "train_s": med(p.train_s for p in ps),
            "samples_per_s": med(p.samples_per_s for p in ps),
            "trained_samples": med(p.trained_samples for p in ps),
            "acc_before": med(p.accuracy_before for p in ps),
            "final_acc": med(p.accuracy_final for p in ps),
            "final_acc_per_seed": [p.accuracy_final for p in ps],
            "reward_final": med(p.reward_final for p in ps),
            "trainer_idle": med(p.idle_fraction for p in ps),
            "tool_wait_s_per_step": med(p.extra.get("env_wait_s_per_step") for p in ps),
            "tool_calls_per_step": med(p.extra.get("tool_calls_per_step") for p in ps),
            "episodes_in_flight": {
                "mean": med(p.extra.get("episodes_in_flight_mean") for p in ps),
                "max": med(p.extra.get("episodes_in_flight_max") for p in ps),
            },
        }

    def sps(system: str) -> float | None:
        return (out.get(system) or {}).get("samples_per_s")

    out["speedup_vs_trl"] = _stats.ratio(sps("astraflow_async"), sps("trl"))
    out["speedup_async_over_sync"] = _stats.ratio(sps("astraflow_async"), sps("astraflow_sync"))
    out["speedup_sync_vs_trl"] = _stats.ratio(sps("astraflow_sync"), sps("trl"))
    return out


def print_tools_report(summary: dict[str, Any], runs: list[_results.RunResult]) -> None:
    f = _report.fmt
    rows = [
        [
            s, str(d["runs"]), f(d["train_s"], "{:.0f}", "s"), f(d["samples_per_s"], "{:.2f}"),
            f(d["acc_before"], "{:.3f}"), f(d["final_acc"], "{:.3f}"),
            f(d["trainer_idle"], "{:.2f}"), f(d["tool_wait_s_per_step"], "{:.1f}", "s"),
            f(d["episodes_in_flight"]["mean"], "{:.0f}")
            + " / " + f(d["episodes_in_flight"]["max"], "{:.0f}"),
        ]
        for s in SYSTEMS
        if (d := summary.get(s))
    ]  # fmt: skip
    _report.console.print(
        _report.table(
            "Function calling behind a slow tool: TRL's own tool loop vs AstraFlow (median over "
            "seeds; held-out success of sampled tool episodes)",
            [
                "system",
                "runs",
                "train",
                "samples/s",
                "acc before",
                "acc final",
                "trainer idle",
                "TRL tool wait/step",
                "in flight mean / max",
            ],
            rows,
        )  # fmt: skip
    )
    _report.console.print(
        f"samples/s at equal trained samples: async over TRL "
        f"[bold]{f(summary['speedup_vs_trl'], '{:.2f}', 'x')}[/], async over sync "
        f"[bold]{f(summary['speedup_async_over_sync'], '{:.2f}', 'x')}[/], sync over TRL "
        f"{f(summary['speedup_sync_vs_trl'], '{:.2f}', 'x')}"
    )
    for r in runs:
        if not r.ok:
            _report.console.print(f"[red]tools {r.system} seed {r.seed} failed:[/] {r.error}")


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = _cli.bench_parser(__doc__)
    _cli.add_output_flags(ap, quick="math case, 1 seed, few steps (under 3 minutes)")
    _cli.add_run_flags(ap)
    _cli.add_comparison_flags(ap, SYSTEMS)
    ap.add_argument(
        "--cases",
        default=None,
        help=f"comma-separated, some of {', '.join(CASES)} (default: math with --quick, else all)",
    )
    ap.add_argument("--sandbox-steps", type=int, default=None, help="steps of the sandbox case")
    ap.add_argument("--sandbox-seeds", type=int, default=1, help="seeds of the sandbox case")
    ap.add_argument("--tools-steps", type=int, default=None, help="steps of the tools case")
    ap.add_argument("--tools-seeds", type=int, default=None, help="seeds of the tools case")
    ap.add_argument(
        "--journal",
        type=Path,
        default=None,
        help="append each finished run here (JSON lines) and skip the runs it already holds: "
        "a long run stopped part-way continues",
    )
    ap.add_argument(
        "--reanalyse",
        type=Path,
        default=None,
        metavar="JSON",
        help="recompute the declared figures of a stored --json file from its per-seed "
        "evaluation curves (nothing is run) and write them into it, the earlier ones kept",
    )
    ap.add_argument(
        "--allow-dirty",
        action="store_true",
        help="write --json from a tree with uncommitted changes (marked allow_dirty in the "
        "JSON; docs/results.md does not show it as a headline)",
    )
    _cli.add_set_flag(ap)
    T.add_worker_args(ap)
    ns = ap.parse_args(argv)
    if ns.trl_worker:
        trl_worker(ns)
        return 0
    if ns.reanalyse:
        data = reanalyse(ns.reanalyse)
        _report.console.print(
            f"re-analysed {ns.reanalyse} (declared {data['declared_hash']}): async vs TRL "
            f"sustained {_report.fmt(data['speedup_vs_trl_sustained'], '{:.2f}', 'x')}, "
            f"async vs sync {_report.fmt(data['speedup_async_over_sync_sustained'], '{:.2f}', 'x')}"
        )
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
    eval_every = ns.eval_every or (1 if ns.quick else EVAL_EVERY)
    eval_tasks = ns.eval_tasks or (100 if ns.quick else EVAL_TASKS)
    timeout = ns.timeout or (300.0 if ns.quick else 1200.0)
    # a full tools run: TRL's 20 steps wait ~25 s of tool calls each, plus 3 evaluations of 400
    # episodes; 40 minutes leave room on a shared machine
    tools_timeout = ns.timeout or (300.0 if ns.quick else 2400.0)
    systems = _cli.parse_systems(ap, ns.systems, SYSTEMS)
    cases = [c.strip() for c in (ns.cases or ("math" if ns.quick else ",".join(CASES))).split(",")]
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
            _report.console.print(f"[yellow]sandbox case skipped: {sandbox_skipped}[/]")
    tools_steps = ns.tools_steps or (QUICK_STEPS if ns.quick else TOOLS_STEPS)
    tools_seeds = ns.tools_seeds or (1 if ns.quick else TOOLS_SEEDS)
    tools_settings: dict[str, Any] | None = None
    if "tools" in cases and not ns.from_json:
        tools_settings = tools_case_settings(ns.sets, ns.quick, tools_steps, tools_seeds)
    settings.update(max_steps=steps, eval_every=eval_every, eval_tasks=eval_tasks, seeds=seeds)
    settings["overrides"] = list(ns.sets)
    settings["astraflow_extra_overrides"] = list(ns.af_set)

    runs: list[_results.RunResult] = []
    sandbox_runs: list[_results.RunResult] = []
    tools_runs: list[_results.RunResult] = []
    if ns.from_json:
        saved = json.loads(ns.from_json.read_text())
        runs = [_results.RunResult.from_json(r) for r in saved["runs"]]
        settings = saved["settings"]
        saved_sandbox = saved.get("sandbox") or {}
        sandbox_runs = [_results.RunResult.from_json(r) for r in saved_sandbox.get("runs") or []]
        sandbox_settings = saved_sandbox.get("settings")
        sandbox_skipped = saved_sandbox.get("skipped")
        saved_tools = saved.get("tools") or {}
        tools_runs = [_results.RunResult.from_json(r) for r in saved_tools.get("runs") or []]
        tools_settings = saved_tools.get("settings")
        seeds = 0
    if "math" not in cases:
        seeds = 0
    extra = [*ns.sets, *ns.af_set]
    math_timeout = timeout
    with _runs.bench_workdir(ns.workdir, "astraflow-agentic-") as workdir:
        # one case, one system, one seed: the TRL worker or an AstraFlow run of the case's recipe
        def run(case, system, seed, steps, every, tasks, case_settings) -> _results.RunResult:
            timeout = tools_timeout if case == "tools" else math_timeout
            if system == "trl":
                return run_trl(seed, steps, every, tasks, ns.trl_threads, workdir, timeout,
                               case_settings, case=case)  # fmt: skip
            return run_astraflow(system.removeprefix("astraflow_"), seed, steps, every, tasks,
                                 workdir, timeout, case_settings, extra, case=case)  # fmt: skip

        journal = None
        if ns.journal and not ns.from_json:
            journal = _results.RunJournal(
                ns.journal,
                {"math": settings if seeds else None, "sandbox": sandbox_settings,
                 "tools": tools_settings, "systems": systems, "extra": extra},
            )  # fmt: skip
            _report.console.print(f"journal {ns.journal}: {len(journal)} runs done before")

        def logged(case: str, system: str, seed: int, label: str, job, figures):
            if journal is None:
                return _runs.run_logged(label, job, figures)
            return journal.run(case, system, seed, lambda: _runs.run_logged(label, job, figures))

        accuracy = _train_and("final accuracy", "accuracy_final", "{:.3f}")
        throughput = _train_and("samples/s", "samples_per_s", "{:.1f}")
        for seed in range(seeds):
            for system in systems:
                label = f"{system} seed {seed} ({steps} steps, eval every {eval_every})"
                job = partial(run, "math", system, seed, steps, eval_every, eval_tasks, settings)
                runs.append(logged("math", system, seed, label, job, accuracy))
        for seed in range(ns.sandbox_seeds if sandbox_settings and not ns.from_json else 0):
            for system in systems:
                label = f"sandbox {system} seed {seed} ({sandbox_steps} steps)"
                job = partial(run, "sandbox", system, seed, sandbox_steps, 1, 0, sandbox_settings)
                sandbox_runs.append(logged("sandbox", system, seed, label, job, throughput))
        for seed in range(tools_seeds if tools_settings and not ns.from_json else 0):
            for system in systems:
                t = tools_settings or {}
                label = f"tools {system} seed {seed} ({tools_steps} steps)"
                job = partial(run, "tools", system, seed, tools_steps, t["eval_every"],
                              t["eval_tasks"], t)  # fmt: skip
                tools_runs.append(logged("tools", system, seed, label, job, accuracy))
        summary = analyse(runs, settings) if runs else {}
        if runs:
            summary |= first_crossing_paired(runs, summary.get("target_acc"))
            summary |= analyse_declared(runs)
            # runs from an earlier file were made under that file's declaration, if any
            summary["declared_after_runs"] = bool(ns.from_json) and (
                saved.get("declared_hash") != DECLARED.digest()
                or saved.get("declared_after_runs", True)
            )
        if runs:
            print_report(summary, runs)
        sandbox: dict[str, Any] | None = None
        if sandbox_runs:
            sandbox = analyse_sandbox(sandbox_runs, sandbox_settings or {})
            print_sandbox_report(sandbox, sandbox_runs)
        elif sandbox_skipped:
            sandbox = {"skipped": sandbox_skipped}
            _report.console.print(f"[yellow]sandbox case skipped: {sandbox_skipped}[/]")
        tools: dict[str, Any] | None = None
        if tools_runs:
            tools = analyse_tools(tools_runs, tools_settings or {})
            print_tools_report(tools, tools_runs)
        plotted = _plots.plot_safely(lambda: plot(runs, ns.plot)) if ns.plot and runs else None
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
                "failed_runs": failed_runs(
                    {"math": runs, "sandbox": sandbox_runs, "tools": tools_runs}, journal
                ),
                "allow_dirty": bool(ns.allow_dirty),
                "runs": [r.to_json() for r in runs],
            }
            if sandbox is not None:
                payload["sandbox"] = sandbox | {"runs": [r.to_json() for r in sandbox_runs]}
            if tools is not None:
                payload["tools"] = tools | {"runs": [r.to_json() for r in tools_runs]}
            _report.write_json(ns.json, payload)
            _report.console.print(f"wrote {ns.json}")
    return 0 if all(r.ok for r in [*runs, *sandbox_runs, *tools_runs]) else 1


def tools_case_settings(
    overrides: list[str], quick: bool, steps: int, seeds: int
) -> dict[str, Any]:
    """The tools case's settings: the recipe's (after ``overrides``) plus the run sizes and the
    held-out evaluation (sampled tool episodes at the recipe's temperature)."""
    settings = recipe_settings(overrides, TOOLS_RECIPE)
    settings.update(
        case="tools", max_steps=steps, seeds=seeds, overrides=list(overrides),
        eval_every=steps if quick else TOOLS_EVAL_EVERY,
        eval_tasks=50 if quick else TOOLS_EVAL_TASKS,
        eval_samples=TOOLS_EVAL_SAMPLES, eval_temperature=settings["temperature"],
    )  # fmt: skip
    return settings


def _train_and(label: str, attr: str, spec: str) -> Callable[[_results.PolicyResult | None], str]:
    """A run's outcome figures: its training seconds and its ``attr`` (e.g. final accuracy)."""

    def figures(pol: _results.PolicyResult | None) -> str:
        return (
            f"train {_report.fmt(pol.train_s if pol else None, '{:.0f}', 's')}, {label} "
            f"{_report.fmt(getattr(pol, attr) if pol else None, spec)}"
        )

    return figures


if __name__ == "__main__":
    sys.exit(main())
