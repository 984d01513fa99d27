"""Held-out accuracy computed by a benchmark itself: greedy decoding of a checkpoint, scored by
the recipe's env (for a run whose own final evaluation is missing, and for the baselines)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from _report import console


def greedy_accuracy(model, tokenizer, problems, max_tokens: int, score) -> float:
    """Greedy held-out accuracy: chat-template prompts, ``max_tokens`` new tokens, env scoring.

    The same decoding as AstraFlow's evaluation tasks (greedy, the policy's ``max_tokens``, the
    tiny model's chat template, special tokens skipped when decoding) and the same reward.
    """
    texts = greedy_texts(model, tokenizer, [p["question"] for p in problems], max_tokens)
    correct = sum(
        score(p["question"], p["answer"], text) for p, text in zip(problems, texts, strict=True)
    )
    return correct / len(problems)


def greedy_texts(model, tokenizer, messages: Sequence[str], max_tokens: int) -> list[str]:
    """Greedy replies to single user ``messages`` (chat template, ``max_tokens`` new tokens,
    special tokens skipped), batched: the decoding of AstraFlow's evaluation tasks."""
    import torch

    prompts = []
    for text in messages:
        enc = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=True, add_generation_prompt=True
        )
        prompts.append(list(enc["input_ids"] if hasattr(enc, "keys") else enc))
    was_training = model.training
    model.eval()
    out: list[str] = []
    with torch.no_grad():
        for start in range(0, len(prompts), 150):
            chunk = prompts[start : start + 150]
            ids, mask = left_pad(chunk, tokenizer.pad_token_id)
            width = ids.shape[1]
            gen = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=max_tokens,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            out += tokenizer.batch_decode(gen[:, width:], skip_special_tokens=True)
    if was_training:
        model.train()
    return out


def load_published(model, run_dir: Path, policy: str, version: int) -> bool:
    """Load weight version ``version`` of ``policy`` from a finished run's weight store into
    ``model`` (a full model of the run's architecture); False when the store does not hold it
    (``trainer.keep_versions`` too small). A tensor other than the tied embeddings missing from
    the file is an error, not a silently half-loaded model."""
    from safetensors.torch import load_file

    weights = Path(run_dir) / "weights" / policy / f"v{version}" / "model.safetensors"
    if not weights.exists():
        return False
    missing, unexpected = model.load_state_dict(load_file(weights), strict=False)
    if unexpected or any("embed" not in k and "lm_head" not in k for k in missing):
        raise RuntimeError(f"{policy} v{version}: missing {missing}, unexpected {unexpected}")
    return True


def tool_accuracy(
    model, tokenizer, problems, max_tokens: int, score=None, *, env: str, env_kwargs: dict[str, Any],
    tool_parser: str = "hermes", max_turns: int = 2, samples: int = 1,
    temperature: float | None = None, seed: int = 0,
) -> float:  # fmt: skip
    """Held-out success of function-calling episodes (``astraflow/Tools-v0``), each played as the
    ``tool_agent`` workflow plays it: the prompt rendered with the env's tools by AstraFlow's
    ``ChatRenderer``, each turn parsed by the policy's tool parser, calls run by the env (no
    latency: evaluation is off every clock) and their results appended as tokens, the final
    answer scored by the env; a call that does not parse ends the episode unscored. Batched
    ``generate`` over the episodes still running, ``samples`` episodes per problem, greedy when
    ``temperature`` is None, else sampled with ``torch`` seeded by ``seed`` (the same draws for
    every system's checkpoint). ``score`` is unused (the env scores), kept for the common
    signature of :func:`accuracy_function`."""
    import torch
    from astraflow.envs.registry import make_env

    from astraflow.rollout.workflows.tokens import ChatRenderer
    from astraflow.tools.parsers import get_tool_parser, turn_text

    parser = get_tool_parser(tool_parser, tokenizer)
    envs, seqs, renderers = [], [], []
    for p in problems:
        for _ in range(samples):
            e = make_env(env, **{**env_kwargs, "max_turns": max_turns})
            obs, info = e.reset(
                options={"task": {"question": p["question"], "answer": p["answer"]}}
            )
            renderers.append(ChatRenderer(tokenizer, tools=info.get("tools") or None))
            seqs.append(renderers[-1].prompt_ids(obs))
            envs.append(e)
    rewards = [0.0] * len(envs)
    was_training = model.training
    model.eval()
    if temperature is not None:
        torch.manual_seed(seed)
    active = list(range(len(envs)))
    eos = tokenizer.eos_token_id
    try:
        for _turn in range(max_turns):
            if not active:
                break
            gens: list[list[int]] = []
            with torch.no_grad():
                for start in range(0, len(active), 128):
                    chunk = [seqs[i] for i in active[start : start + 128]]
                    ids, mask = left_pad(chunk, tokenizer.pad_token_id)
                    sampling = (
                        {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0}
                        if temperature is not None
                        else {"do_sample": False}
                    )
                    out = model.generate(
                        input_ids=ids, attention_mask=mask, max_new_tokens=max_tokens,
                        pad_token_id=tokenizer.pad_token_id, eos_token_id=eos, **sampling,
                    )  # fmt: skip
                    for row in out[:, ids.shape[1] :].tolist():
                        cut = row.index(eos) + 1 if eos in row else len(row)
                        gens.append(row[:cut])
            still = []
            for i, g in zip(active, gens, strict=True):
                seqs[i] = seqs[i] + g
                turn = parser.parse(turn_text(tokenizer, g, parser), g)
                if not turn.valid:
                    continue  # invalid_tool_call: the episode ends with reward 0
                action = list(turn.calls) if turn.calls else turn.content
                _obs, reward, terminated, truncated, info = envs[i].step(action)
                rewards[i] += float(reward)
                if terminated or truncated:
                    continue
                seqs[i] = seqs[i] + renderers[i].messages_ids(info.get("tool_messages") or [], g)
                still.append(i)
            active = still
    finally:
        for e in envs:
            e.close()
        if was_training:
            model.train()
    return sum(r >= 1.0 for r in rewards) / max(1, len(rewards))


def accuracy_function(cfg: dict[str, Any]):
    """The held-out metric of a run's settings: :func:`tool_accuracy` for a function-calling env
    (``astraflow/Tools-v0``; ``eval_samples`` sampled episodes per problem at the recipe's
    temperature), else :func:`greedy_accuracy`. One signature:
    ``accuracy(model, tokenizer, problems, max_tokens, score)``."""
    if cfg.get("env") != "astraflow/Tools-v0":
        return greedy_accuracy
    from functools import partial

    return partial(
        tool_accuracy, env=cfg["env"], env_kwargs=dict(cfg.get("env_kwargs") or {}),
        tool_parser=cfg.get("tool_parser") or "hermes", max_turns=cfg.get("max_turns") or 2,
        samples=cfg.get("eval_samples") or 1, temperature=cfg.get("eval_temperature"),
    )  # fmt: skip


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int):
    """``(input_ids, attention_mask)`` of token lists padded on the left to one width: the batch
    layout ``generate`` continues from (every prompt ends at the last column)."""
    import torch

    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, width - len(s) :] = torch.tensor(s)
        mask[i, width - len(s) :] = 1
    return ids, mask


def env_scorer(env_id: str, env_kwargs: dict[str, Any]):
    """``score(question, answer, text)``: the recipe env's reward for ``text`` (Math env)."""
    from astraflow.envs.registry import make_env

    env = make_env(env_id, **env_kwargs)

    def score(question: str, answer: str, text: str) -> float:
        env.reset(options={"task": {"question": question, "answer": answer}})
        _, reward, *_ = env.step(text)
        return float(reward)

    return score


def checkpoint_accuracy(settings: dict[str, Any], seed: int, policies: Iterable[str] | None = None):
    """A :data:`FinalEval` that evaluates ``run_dir/checkpoints/POLICY/checkpoint-STEP`` greedily
    on the same held-out problems as the runs' own evaluations (single-answer math policies).

    ``settings``: env, env_kwargs, task_set, eval_split, eval_tasks, max_tokens. ``policies``
    limits it to the policies whose held-out metric is exactly that (e.g. a solver, not a
    verifier); others return None and stay marked as missing.
    """
    allowed = None if policies is None else set(policies)

    def final_eval(run_dir: Path, policy: str, step: int) -> float | None:
        if allowed is not None and policy not in allowed:
            return None
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        from astraflow.models import load_tokenizer

        hf_logging.disable_progress_bar()  # keep the benchmark's own output readable
        from astraflow.tasks.catalog import load_task_set

        ckpt = Path(run_dir) / "checkpoints" / policy / f"checkpoint-{step}"
        if not (ckpt / "config.json").exists():
            console.print(f"[yellow]no checkpoint at {ckpt}: final accuracy left out[/]")
            return None
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
            tokenizer = load_tokenizer(ckpt)
            tokenizer.padding_side = "left"
            problems = load_task_set(
                settings["task_set"], settings["eval_split"], seed=seed,
                limit=settings["eval_tasks"],
            )  # fmt: skip
            score = env_scorer(settings["env"], settings["env_kwargs"])
            return greedy_accuracy(model, tokenizer, problems, settings["max_tokens"], score)
        finally:
            torch.set_num_threads(threads)

    return final_eval
