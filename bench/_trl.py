"""The TRL baseline's core, shared by ``vs_trl.py`` (single-turn math) and ``agentic.py``
(multi-turn, slow tools).

Why one module: both benchmarks claim to race AstraFlow against *the same* stock
``trl.GRPOTrainer``. That claim holds only if the two TRL runs are configured, clocked and
recorded identically, so everything that is not the task lives here once:

* :func:`grpo_settings`: the recipe's hyper-parameters the TRL run must match;
* :class:`Worker` (the subprocess side): the ``GRPOConfig``, the held-out evaluation in a callback
  whose pauses are taken out of TRL's clock, the ``step``/``eval`` events in AstraFlow's
  ``metrics.jsonl`` format, the measurement of generation time, and ``trl.json``;
* :func:`run_worker` (the benchmark side): the subprocess, its environment, and the
  :class:`~_results.RunResult` read back from what the worker wrote.

A benchmark supplies only what differs: its dataset rows, reward functions, an optional
``rollout_func`` (agentic's multi-turn episodes) and the extra fields it records.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _evaluation
import _records
import _results
import _runs

Fields = Callable[[], dict[str, Any]]


def grpo_settings(recipe) -> dict[str, Any]:
    """The recipe's model, sampling, batch, loss and data settings that the TRL run is given,
    so that both systems train with the same hyper-parameters (read from the recipe itself)."""
    policy = recipe.policies[recipe.workflow.roles["agent"]]
    return {
        "model": policy.model,
        "temperature": policy.sampling.temperature,
        "top_p": policy.sampling.top_p,
        "max_tokens": policy.sampling.max_tokens,
        # max_tokens x max_turns, as AstraFlow's trainer has it (see grpo_config)
        "max_completion_length": recipe.max_completion_length(recipe.workflow.roles["agent"]),
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
        "task_set": recipe.tasks.sets[0].name,
        "train_split": recipe.tasks.sets[0].split,
        "eval_split": recipe.evaluation.split,
        "max_steps": recipe.run.max_steps,
    }


# ----------------------------------------------------------------------------- command line


def add_worker_args(ap: argparse.ArgumentParser) -> None:
    """The hidden flags by which a benchmark re-runs itself as the TRL worker subprocess."""
    ap.add_argument("--trl-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=2, help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    ap.add_argument("--settings", default="{}", help=argparse.SUPPRESS)


def grpo_config(cfg: dict[str, Any], *, seed: int, steps: int, out: Path):
    """``GRPOConfig`` with the recipe's settings (``cfg`` from :func:`grpo_settings`): constant
    learning rate, one optimizer step per ``groups_per_step`` groups, float32 on the CPU, no
    shuffling, dropout or logging. The trainer parity test builds TRL from this same function."""
    from trl import GRPOConfig

    group = cfg["group_size"]
    return GRPOConfig(
        output_dir=str(out / "trl"),
        seed=seed,
        max_steps=steps,
        num_generations=group,
        per_device_train_batch_size=group * cfg["groups_per_step"],
        gradient_accumulation_steps=1,
        learning_rate=cfg["learning_rate"],
        lr_scheduler_type="constant",
        loss_type=cfg["loss_type"],
        beta=cfg["beta"],
        epsilon=cfg["epsilon"],
        max_grad_norm=cfg["max_grad_norm"],
        scale_rewards=cfg["scale_rewards"],
        # AstraFlow's trainer's value, dr_grpo's normaliser (single-turn: max_tokens); a
        # multi-turn rollout_func caps each turn at max_tokens itself
        max_completion_length=cfg["max_completion_length"],
        temperature=cfg["temperature"],
        top_p=cfg["top_p"],
        top_k=0,
        shuffle_dataset=False,
        disable_dropout=True,
        use_cpu=True,
        bf16=False,  # TRL defaults to bf16 autocast; AstraFlow's CPU trainer is float32
        fp16=False,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        log_completions=False,
        dataloader_num_workers=0,
    )


# ----------------------------------------------------------------------------- worker side


@dataclass
class Worker:
    """One TRL training run inside the worker subprocess: what it loaded and its clock.

    ``clock()`` is absolute time minus the evaluation pauses: TRL evaluates in a callback that
    stops training, and that pause says nothing about training speed (``_records`` docstring).
    """

    ns: argparse.Namespace
    cfg: dict[str, Any]
    out: Path
    train_tasks: list[dict[str, Any]]
    held_out: list[dict[str, Any]]
    tokenizer: Any
    model: Any
    score: Callable[[str, str, str], float] | None
    eval_s: float = 0.0
    generate_s: float = 0.0
    train_begin: float | None = None
    _step: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def start(cls, ns: argparse.Namespace) -> Worker:
        """Set torch's threads, then load the train tasks (``steps x groups`` in loader order),
        the held-out problems (none when ``--eval-tasks 0``), the tokenizer and the model."""
        import torch

        torch.set_num_threads(ns.threads)
        from astraflow.tasks.catalog import load_task_set
        from transformers import AutoModelForCausalLM

        from astraflow.models import load_tokenizer, resolve_model

        cfg = json.loads(ns.settings)
        out = Path(ns.out)
        out.mkdir(parents=True, exist_ok=True)
        train = load_task_set(
            cfg["task_set"], cfg["train_split"], seed=ns.seed,
            limit=ns.steps * cfg["groups_per_step"],
        )  # fmt: skip
        held_out = (
            load_task_set(cfg["task_set"], cfg["eval_split"], seed=ns.seed, limit=ns.eval_tasks)
            if ns.eval_tasks
            else []
        )
        path = resolve_model(cfg["model"])
        tokenizer = load_tokenizer(path)
        tokenizer.padding_side = "left"
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        score = _evaluation.env_scorer(cfg["env"], cfg["env_kwargs"]) if held_out else None
        return cls(ns, cfg, out, train, held_out, tokenizer, model, score)

    def clock(self) -> float:
        """Absolute time with the evaluation pauses taken out (TRL's training clock)."""
        return time.time() - self.eval_s

    def write(self, record: dict[str, Any]) -> None:
        with (self.out / "metrics.jsonl").open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def evaluate(self, step: int, model) -> None:
        """Held-out accuracy of ``model`` (the bench's common code), off the clock."""
        started = time.time()
        accuracy = _evaluation.accuracy_function(self.cfg)  # greedy math, or tool episodes
        acc = accuracy(model, self.tokenizer, self.held_out, self.cfg["max_tokens"], self.score)
        took = time.time() - started
        self.eval_s += took
        self.write({"type": "eval", "policy": "policy", "step": step, "accuracy": acc,
                    "n": len(self.held_out), "eval_s": took, "time": self.clock()})  # fmt: skip

    def callback(self, step_fields: Fields | None = None):
        """The ``TrainerCallback`` that records the training start, one ``step`` event per
        optimizer step (timed at the step's end, plus ``step_fields()``) and the evaluations at
        step 0, every ``--eval-every`` steps and at the last step."""
        from transformers import TrainerCallback

        w, ns = self, self.ns
        samples = self.cfg["group_size"] * self.cfg["groups_per_step"]

        class HeldOutEval(TrainerCallback):
            def on_train_begin(self, args, st, control, model=None, **kw):
                w.train_begin = time.time()
                if w.held_out:
                    w.evaluate(0, model)

            def on_step_end(self, args, st, control, model=None, **kw):
                w._step = {"time": w.clock(), "step": st.global_step}

            def on_log(self, args, st, control, logs=None, model=None, **kw):
                pending, w._step = w._step, {}
                if not pending or not logs or "loss" not in logs:
                    return
                step = pending["step"]
                w.write(
                    {
                        "type": "step",
                        "policy": "policy",
                        "step": step,
                        "samples": samples,
                        "reward_mean": logs.get("reward"),
                        "time": pending["time"],
                        "generate_s_total": w.generate_s,
                        **(step_fields() if step_fields else {}),
                    }
                )
                if w.held_out and (step % ns.eval_every == 0 or step == ns.steps):
                    w.evaluate(step, model)

        return HeldOutEval()

    def config(self, **overrides: Any):
        """``GRPOConfig`` with the recipe's settings (:func:`grpo_config`), plus ``overrides``."""
        config = grpo_config(self.cfg, seed=self.ns.seed, steps=self.ns.steps, out=self.out)
        for key, value in overrides.items():
            setattr(config, key, value)
        return config

    def train(
        self, rows: list[dict[str, Any]], reward_funcs: Sequence[Callable[..., list[float]]],
        rollout_func: Callable[..., dict[str, Any]] | None = None,
        step_fields: Fields | None = None, info_fields: Fields | None = None,
        tools: Sequence[Callable[..., Any]] | None = None,
        config_overrides: dict[str, Any] | None = None,
    ) -> None:  # fmt: skip
        """Train on ``rows`` (the dataset, in order) and write ``trl.json`` (training start,
        end on the clock, evaluation and generation seconds, plus ``info_fields()``).

        ``tools``: TRL's own function calling (``GRPOTrainer(tools=...)``: its chat-template
        rendering, ``parse_response`` and tool loop); ``config_overrides``: ``GRPOConfig`` fields
        beyond the recipe's (e.g. ``max_tool_calling_iterations``)."""
        from datasets import Dataset
        from trl import GRPOTrainer

        trainer = GRPOTrainer(
            model=self.model,
            reward_funcs=list(reward_funcs),
            args=self.config(**(config_overrides or {})),
            train_dataset=Dataset.from_list(rows),
            processing_class=self.tokenizer,
            callbacks=[self.callback(step_fields)],
            rollout_func=rollout_func,
            tools=list(tools) if tools else None,
        )
        generate = trainer._generate_and_score_completions

        def timed_generate(*a, **kw):  # measurement only: how long the learner is not optimizing
            started = time.time()
            try:
                return generate(*a, **kw)
            finally:
                self.generate_s += time.time() - started

        trainer._generate_and_score_completions = timed_generate
        trainer.train()
        info = {
            "train_begin": self.train_begin,
            "end": self.clock(),
            "eval_s": self.eval_s,
            "generate_s": self.generate_s,
        }
        (self.out / "trl.json").write_text(
            json.dumps(info | (info_fields() if info_fields else {}))
        )


# ----------------------------------------------------------------------------- benchmark side


def run_worker(
    script: Path, system: str, seed: int, steps: int, eval_every: int, eval_tasks: int,
    threads: int, out: Path, log: Path, timeout_s: float, settings: dict[str, Any],
    env: dict[str, str] | None = None,
    extras: Callable[[_results.PolicyResult, list[dict[str, Any]], dict[str, Any]], None] | None = None,
) -> _results.RunResult:  # fmt: skip
    """Run ``script --trl-worker`` in a subprocess and read its result back.

    Timed from ``on_train_begin`` (start-up reported apart); trainer idle = the share of training
    time spent generating and scoring. ``extras(policy_result, step_records, trl_json)`` adds the
    bench's own figures.
    """
    argv = [
        sys.executable, str(Path(script).resolve()), "--trl-worker",
        "--seed", str(seed), "--steps", str(steps), "--eval-every", str(eval_every),
        "--eval-tasks", str(eval_tasks), "--threads", str(threads), "--out", str(out),
        "--settings", json.dumps(settings),
    ]  # fmt: skip
    # PASSIVE: idle OpenMP threads sleep instead of spinning. On a busy 2-core machine a spinning
    # 2-thread torch runs 10-20x slower (measured: 64x12-token generate 0.3s -> 4.6s).
    child = _runs.child_env(threads, {"OMP_WAIT_POLICY": "PASSIVE", **(env or {})})
    outcome = _runs.run_subprocess(argv, log, timeout_s, child)
    result = _results.RunResult(system, seed, ok=False, wall_s=outcome.wall_s, run_dir=str(out))
    records = _records.read_jsonl(out / "metrics.jsonl")
    info_path = out / "trl.json"
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    begin = info.get("train_begin")
    if begin is None:
        begin = min((float(r["time"]) for r in records if "time" in r), default=outcome.started)
    result.startup_s = begin - outcome.started
    result.t0 = begin
    res = _results.summarize_policy(records, "policy", begin)
    steps_recs = _records.step_records(records, "policy")
    if steps_recs and res.train_s:
        generate_s = float(steps_recs[-1]["generate_s_total"])
        res.idle_fraction = min(1.0, generate_s / res.train_s)
        res.extra["generate_s_per_step"] = generate_s / len(steps_recs)
        res.extra["optimize_s_per_step"] = (res.train_s - generate_s) / len(steps_recs)
    res.extra["eval_s_excluded"] = info.get("eval_s")
    if extras is not None:
        extras(res, steps_recs, info)
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
        result.error = "; ".join(problems) + "\n" + _runs._log_tail(log)
    result.ok = not problems
    return result
