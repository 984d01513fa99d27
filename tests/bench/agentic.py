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
import tempfile
import time
from pathlib import Path
from typing import Any

import _harness as H

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
    policy = recipe.policies[recipe.workflow.roles["agent"]]
    latency = recipe.tasks.env_latency
    return {
        "model": policy.model,
        "temperature": policy.sampling.temperature,
        "top_p": policy.sampling.top_p,
        "max_tokens": policy.sampling.max_tokens,
        "group_size": recipe.tasks.group_size,
        "groups_per_step": policy.trainer.groups_per_step,
        "learning_rate": policy.trainer.learning_rate,
        "loss_type": policy.trainer.loss_type,
        "beta": policy.trainer.beta,
        "epsilon": policy.trainer.epsilon,
        "max_grad_norm": policy.trainer.max_grad_norm,
        "scale_rewards": policy.trainer.scale_rewards,
        "env": recipe.tasks.env,
        "env_kwargs": recipe.tasks.env_kwargs,
        "max_turns": recipe.workflow.max_turns,
        "env_latency": latency.model_dump() if latency is not None else None,
        "task_set": recipe.tasks.sets[0].name,
        "train_split": recipe.tasks.sets[0].split,
        "eval_split": recipe.evaluation.split,
        "max_steps": recipe.run.max_steps,
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

    torch.set_num_threads(ns.threads)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from astraflow.models import load_tokenizer, resolve_model
    from astraflow.rollout.workflows.tokens import ChatRenderer
    from envs import make_env
    from envs.wrappers.latency import LatencyEnvFactory
    from tasks.catalog import load_task_set

    cfg = json.loads(ns.settings)
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    metrics_path = out / "metrics.jsonl"
    group, groups = cfg["group_size"], cfg["groups_per_step"]
    train = load_task_set(
        cfg["task_set"], cfg["train_split"], seed=ns.seed, limit=ns.steps * groups
    )
    held_out = (
        load_task_set(cfg["task_set"], cfg["eval_split"], seed=ns.seed, limit=ns.eval_tasks)
        if ns.eval_tasks
        else []
    )
    # TRL hands rollout_func only the prompts: key each task by its prompt's text (math: the
    # question; code: the task id, as the env renders the prompt itself on reset).
    code = "question" not in train[0]
    keys = [p["id"] if code else p["question"] for p in train]
    tasks = dict(zip(keys, train, strict=True))
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": k}]} for k in keys])
    path = resolve_model(cfg["model"])
    tokenizer = load_tokenizer(path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    score = H.env_scorer(cfg["env"], cfg["env_kwargs"]) if held_out else None
    renderer = ChatRenderer(tokenizer)
    latency = cfg["env_latency"]

    def build(env_id: str, kwargs: dict[str, Any]):
        return make_env(env_id, **{**cfg["env_kwargs"], **kwargs})

    # The same wrapper and seeding scheme as a rollout node (stream "trl" instead of a node name).
    factory = LatencyEnvFactory(build, latency, seed=ns.seed, stream="trl") if latency else build
    state: dict[str, Any] = {
        "eval_s": 0.0,
        "generate_s": 0.0,
        "env_wait_s": 0.0,
        "in_flight_integral": 0.0,
        "in_flight_max": 0,
        "active_per_turn": [],
        "train_begin": None,
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
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, s in enumerate(seqs):
            ids[i, width - len(s) :] = torch.tensor(s)
            mask[i, width - len(s) :] = 1
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

    def evaluate(m) -> float:
        return H.greedy_accuracy(m, tokenizer, held_out, cfg["max_tokens"], score)

    def clock() -> float:
        """Absolute time with the evaluation pauses taken out (TRL's training clock)."""
        return time.time() - state["eval_s"]

    def write(record: dict[str, Any]) -> None:
        with metrics_path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    class HeldOutEval(TrainerCallback):
        def _eval(self, step: int, m) -> None:
            started = time.time()
            acc = evaluate(m)
            took = time.time() - started
            state["eval_s"] += took
            write({"type": "eval", "policy": "policy", "step": step, "accuracy": acc,
                   "n": len(held_out), "eval_s": took, "time": clock()})  # fmt: skip

        def on_train_begin(self, args, st, control, model=None, **kw):
            state["train_begin"] = time.time()
            if held_out:
                self._eval(0, model)

        def on_step_end(self, args, st, control, model=None, **kw):
            state["step_time"] = clock()
            state["pending_step"] = st.global_step

        def on_log(self, args, st, control, logs=None, model=None, **kw):
            step = state.pop("pending_step", None)
            if step is None or not logs or "loss" not in logs:
                return
            write(
                {
                    "type": "step",
                    "policy": "policy",
                    "step": step,
                    "samples": group * groups,
                    "reward_mean": logs.get("reward"),
                    "time": state["step_time"],
                    "generate_s_total": state["generate_s"],
                    "env_wait_s_total": state["env_wait_s"],
                    "in_flight_integral": state["in_flight_integral"],
                    "in_flight_max": state["in_flight_max"],
                    "active_per_turn": state["active_per_turn"][-1]
                    if state["active_per_turn"]
                    else [],
                }
            )
            if held_out and (step % ns.eval_every == 0 or step == ns.steps):
                self._eval(step, model)

    args = GRPOConfig(
        output_dir=str(out / "trl"),
        seed=ns.seed,
        max_steps=ns.steps,
        num_generations=group,
        per_device_train_batch_size=group * groups,
        gradient_accumulation_steps=1,
        learning_rate=cfg["learning_rate"],
        lr_scheduler_type="constant",
        loss_type=cfg["loss_type"],
        beta=cfg["beta"],
        epsilon=cfg["epsilon"],
        max_grad_norm=cfg["max_grad_norm"],
        scale_rewards=cfg["scale_rewards"],
        max_completion_length=cfg["max_tokens"],  # per turn: generation_config.max_new_tokens
        temperature=cfg["temperature"],
        top_p=cfg["top_p"],
        top_k=0,
        shuffle_dataset=False,
        disable_dropout=True,
        use_cpu=True,
        bf16=False,
        fp16=False,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        log_completions=False,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[env_return],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[HeldOutEval()],
        rollout_func=rollout_func,
    )
    inner = trainer._generate_and_score_completions

    def timed(*a, **kw):  # measurement only: how long the learner is not optimizing
        started = time.time()
        try:
            return inner(*a, **kw)
        finally:
            state["generate_s"] += time.time() - started

    trainer._generate_and_score_completions = timed
    trainer.train()
    (out / "trl.json").write_text(
        json.dumps(
            {
                "train_begin": state["train_begin"],
                "end": clock(),
                "eval_s": state["eval_s"],
                "generate_s": state["generate_s"],
                "env_wait_s": state["env_wait_s"],
                "active_per_turn": state["active_per_turn"],
                "sandbox_s": state["sandbox_s"],
                "call_s": state["call_s"],
            }
        )
    )
    pool.shutdown()


def run_trl(
    seed: int, steps: int, eval_every: int, eval_tasks: int, threads: int, workdir: Path,
    timeout_s: float, settings: dict[str, Any], case: str = "math",
) -> H.RunResult:  # fmt: skip
    out = workdir / f"{case}-trl-s{seed}"
    argv = [
        sys.executable, str(Path(__file__).resolve()), "--trl-worker",
        "--seed", str(seed), "--steps", str(steps), "--eval-every", str(eval_every),
        "--eval-tasks", str(eval_tasks), "--threads", str(threads), "--out", str(out),
        "--settings", json.dumps(settings),
    ]  # fmt: skip
    env = H.child_env(threads, {"OMP_WAIT_POLICY": "PASSIVE", "TRL_EXPERIMENTAL_SILENCE": "1"})
    log = workdir / f"{case}-trl-s{seed}.log"
    outcome = H.run_subprocess(argv, log, timeout_s, env)
    result = H.RunResult("trl", seed, ok=False, wall_s=outcome.wall_s, run_dir=str(out))
    records = H.read_jsonl(out / "metrics.jsonl")
    info_path = out / "trl.json"
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    begin = info.get("train_begin")
    if begin is None:
        begin = min((float(r["time"]) for r in records if "time" in r), default=outcome.started)
    result.startup_s = begin - outcome.started
    result.t0 = begin
    res = H.summarize_policy(records, "policy", begin)
    steps_recs = H.step_records(records, "policy")
    if steps_recs and res.train_s:
        last = steps_recs[-1]
        generate_s = float(last["generate_s_total"])
        res.idle_fraction = min(1.0, generate_s / res.train_s)
        res.extra["generate_s_per_step"] = generate_s / len(steps_recs)
        res.extra["env_wait_s_per_step"] = float(last["env_wait_s_total"]) / len(steps_recs)
        res.extra["optimize_s_per_step"] = (res.train_s - generate_s) / len(steps_recs)
        res.extra["episodes_in_flight_mean"] = float(last["in_flight_integral"]) / res.train_s
        res.extra["episodes_in_flight_max"] = int(last["in_flight_max"])
        res.extra["active_per_turn"] = [r.get("active_per_turn") for r in steps_recs]
    res.extra["eval_s_excluded"] = info.get("eval_s")
    if info.get("sandbox_s"):
        res.extra["sandbox_s"] = [x for x in info["sandbox_s"] if x is not None]
        res.extra["env_call_s"] = info.get("call_s") or []
    res.extra["episodes"] = res.trained_samples
    result.policies["policy"] = res
    problems = []
    if outcome.timed_out:
        problems.append(f"TRL run killed after {timeout_s:.0f}s")
    elif outcome.returncode != 0:
        problems.append(f"TRL worker exited with status {outcome.returncode}")
    if res.steps == 0:
        problems.append("no TRL step recorded")
    if problems:
        result.error = "; ".join(problems) + "\n" + H._log_tail(log)
    result.ok = not problems
    return result


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
    present = [s for s in SYSTEMS if any(r.system == s for r in runs)]
    by_system: dict[str, list[H.PolicyResult]] = {s: [] for s in present}
    walls: dict[str, list[float]] = {s: [] for s in present}
    for r in runs:
        if r.ok and "policy" in r.policies:
            by_system[r.system].append(r.policies["policy"])
            walls[r.system].append(r.wall_s)
    before = H.spread(p.accuracy_before for ps in by_system.values() for p in ps).median
    trl_final = H.spread(p.accuracy_final for p in by_system.get("trl", [])).median
    # The ladder: every 0.01 from just above the start to the best median final accuracy.
    finals = [H.spread(p.accuracy_final for p in ps).median for ps in by_system.values() if ps]
    top = max((f for f in finals if f is not None), default=None)
    levels: list[float] = []
    if before is not None and top is not None:
        level = math.floor(before * 100 + 1) / 100
        while level <= top + 1e-9:
            levels.append(round(level, 2))
            level += 0.01
    systems: dict[str, Any] = {}
    for s, ps in by_system.items():
        tta_trl = [H.time_to_accuracy(p.evals, trl_final) if trl_final else None for p in ps]
        systems[s] = {
            "runs": len(ps),
            "wall_s": H.spread_json(H.spread(walls[s])),
            "train_s": H.spread_json(H.spread(p.train_s for p in ps)),
            "samples_per_s": H.spread_json(H.spread(p.samples_per_s for p in ps)),
            "trained_samples": H.spread_json(H.spread(p.trained_samples for p in ps)),
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
        from envs.code.sandbox import select_backend

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
    def sp(d: dict[str, Any], spec: str = "{:.1f}", unit: str = "") -> str:
        return H.Spread(d["median"], d["min"], d["max"], d["n"]).text(spec, unit)

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
    ladder = summary.get("ladder") or []
    if ladder:
        systems = list(summary["systems"])
        H.console.print(
            H.table(
                "median seconds to reach each held-out accuracy ('-' = not reached by half the "
                "seeds)",
                ["accuracy", *systems],
                [
                    [
                        lvl,
                        *(
                            H.fmt(summary["systems"][s]["time_to_acc"].get(lvl), "{:.0f}", "s")
                            for s in systems
                        ),
                    ]
                    for lvl in ladder
                ],
            )  # fmt: skip
        )
    for s, d in summary["systems"].items():
        if d["drops"]:
            H.console.print(f"[dim]{s} dropped samples by reason (per run): {d['drops']}[/]")
    for r in runs:
        if not r.ok:
            H.console.print(f"[red]{r.system} seed {r.seed} failed:[/] {r.error}")
    for note in NOTES:
        H.console.print(f"[dim]- {note}[/]")


def plot(runs: list[H.RunResult], path: Path) -> Path | None:
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
        ax.plot([e.t for e in p.evals], [e.accuracy for e in p.evals], color=COLOURS[r.system],
                marker="o", ms=3, alpha=0.75, lw=1.2, label=label)  # fmt: skip
    if not labelled:
        plt.close(fig)
        return None
    ax.set_xscale("symlog", linthresh=10)
    ax.set_xlabel("seconds since training start (evaluation pauses excluded; symlog)")
    ax.set_ylabel("held-out greedy accuracy")
    ax.set_title("Multi-turn math, long-tailed tool latency: one line per seed")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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
    ap.add_argument("--trl-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=2, help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    ap.add_argument("--settings", default="{}", help=argparse.SUPPRESS)
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
    systems = [s.strip() for s in ns.systems.split(",") if s.strip()]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        ap.error(f"--systems: unknown {sorted(unknown)}; expected some of {', '.join(SYSTEMS)}")
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

    tmp = None
    if ns.workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="astraflow-agentic-")
        workdir = Path(tmp.name)
    else:
        workdir = ns.workdir.resolve()
        workdir.mkdir(parents=True, exist_ok=True)
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
    try:
        for seed in range(seeds):
            for system in systems:
                label = f"{system} seed {seed} ({steps} steps, eval every {eval_every})"
                with H.console.status(f"running {label}…"):
                    started = time.time()
                    if system == "trl":
                        r = run_trl(
                            seed, steps, eval_every, eval_tasks, ns.trl_threads, workdir,
                            timeout, settings,
                        )  # fmt: skip
                    else:
                        r = run_astraflow(
                            system.removeprefix("astraflow_"), seed, steps, eval_every,
                            eval_tasks, workdir, timeout, settings, [*ns.sets, *ns.af_set],
                        )  # fmt: skip
                runs.append(r)
                pol = r.policies.get("policy")
                status = "[green]ok[/]" if r.ok else "[red]failed[/]"
                H.console.print(
                    f"{status} {label}: {time.time() - started:.0f}s, train "
                    f"{H.fmt(pol.train_s if pol else None, '{:.0f}', 's')}, final accuracy "
                    f"{H.fmt(pol.accuracy_final if pol else None, '{:.3f}')}"
                )
        for seed in range(ns.sandbox_seeds if sandbox_settings and not ns.from_json else 0):
            for system in systems:
                label = f"sandbox {system} seed {seed} ({sandbox_steps} steps)"
                with H.console.status(f"running {label}…"):
                    started = time.time()
                    if system == "trl":
                        r = run_trl(
                            seed, sandbox_steps, 1, 0, ns.trl_threads, workdir, timeout,
                            sandbox_settings, case="sandbox",
                        )  # fmt: skip
                    else:
                        r = run_astraflow(
                            system.removeprefix("astraflow_"), seed, sandbox_steps, 1, 0,
                            workdir, timeout, sandbox_settings, [*ns.sets, *ns.af_set],
                            case="sandbox",
                        )  # fmt: skip
                sandbox_runs.append(r)
                pol = r.policies.get("policy")
                status = "[green]ok[/]" if r.ok else "[red]failed[/]"
                H.console.print(
                    f"{status} {label}: {time.time() - started:.0f}s, train "
                    f"{H.fmt(pol.train_s if pol else None, '{:.0f}', 's')}, samples/s "
                    f"{H.fmt(pol.samples_per_s if pol else None, '{:.1f}')}"
                )
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
        plotted = None
        if ns.plot and runs:
            try:
                plotted = plot(runs, ns.plot)
            except Exception as exc:  # noqa: BLE001 - the numbers matter more than the picture
                H.console.print(f"[yellow]plot failed: {exc}[/]")
            if plotted:
                H.console.print(f"plot: {plotted}")
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
    finally:
        if tmp is not None:
            tmp.cleanup()
    return 0 if all(r.ok for r in [*runs, *sandbox_runs]) else 1


if __name__ == "__main__":
    sys.exit(main())
