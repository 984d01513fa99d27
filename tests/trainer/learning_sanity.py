"""Learning sanity check (a script, not a test): reward goes up with the real trainer in-process.

An in-process actor-learner loop: the tiny built-in policy samples groups with transformers, a
simple rule scores them, :func:`astraflow.trainer.grpo.build_trainer` takes GRPO steps on them, and
every published version is loaded back into the sampler (so the data stays on-policy, as a rollout
node following the weight store would). The reward is exact-match on two-operand additions, which
the warm-started tiny policy solves only part of the time, so a few dozen CPU steps show the trend.

    python tests/trainer/learning_sanity.py --steps 30
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from trainer_rollouts import arith_producer, arith_prompts  # noqa: E402


def rule_reward(text: str, answer: str) -> float:
    """1 for the exact answer, else 0 (the arithmetic task's own verifier, in one line)."""
    return 1.0 if text.strip() == answer else 0.0


@torch.no_grad()
def greedy_accuracy(model, tok, problems: list[tuple[str, str]]) -> float:
    """Exact-match accuracy of greedy answers on held-out problems (one padded batch)."""
    texts = [
        tok.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
        )
        for q, _ in problems
    ]
    tok.padding_side = "left"
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    out = model.generate(
        **enc,
        do_sample=False,
        max_new_tokens=6,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    answers = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    return sum(a.strip() == ans for a, (_, ans) in zip(answers, problems, strict=True)) / len(
        problems
    )


def main() -> int:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table
    from transformers import AutoModelForCausalLM

    from astraflow.models import load_tokenizer, resolve_model
    from astraflow.recipe.schema import TrainerConfig
    from astraflow.trainer.grpo import build_trainer
    from astraflow.trainer.source import InProcessBatchSource

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--loss", default="dapo")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    console = Console()
    path = resolve_model("builtin:tiny-arith")
    tok = load_tokenizer(path)
    sampler = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    rewards: list[float] = []
    held_out = arith_prompts(300, seed=424242)
    acc_before = greedy_accuracy(sampler, tok, held_out)

    producer = arith_producer(
        sampler, tok, group_size=args.group_size, seed_offset=1000, reward_fn=rule_reward
    )

    def publish(version, state_dict):
        sampler.load_state_dict(state_dict)

    history: list[dict] = []
    with tempfile.TemporaryDirectory() as run_dir, Progress(console=console) as progress:
        task = progress.add_task("GRPO steps", total=args.steps)

        def on_step(report):
            m = report.metrics
            history.append({"step": report.version, **m})
            rewards.append(m["reward"])
            progress.update(task, advance=1, description=f"reward {m['reward']:.3f}")

        cfg = TrainerConfig(
            groups_per_step=args.groups,
            learning_rate=args.lr,
            loss_type=args.loss,
            checkpoint_every=10_000,
        )
        trainer = build_trainer(
            "builtin:tiny-arith",
            cfg,
            InProcessBatchSource(producer=producer),
            run_dir,
            "policy",
            max_steps=args.steps,
            publish=publish,
            on_step=on_step,
        )
        started = time.perf_counter()
        trainer.run(resume=False)
        elapsed = time.perf_counter() - started

    table = Table(title="learning sanity (tiny-arith, exact-match addition)")
    for col in ("step", "reward", "loss", "entropy", "grad_norm", "IS ratio max"):
        table.add_column(col, justify="right")
    for h in history[:: max(1, len(history) // 10)] + history[-1:]:
        table.add_row(
            str(h["step"]),
            f"{h['reward']:.3f}",
            f"{h['loss']:.4f}",
            f"{h['entropy']:.3f}",
            f"{h['grad_norm']:.3f}",
            f"{h['sampling/importance_sampling_ratio/max']:.3f}",
        )
    console.print(table)
    k = max(1, len(rewards) // 5)
    first, last = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
    acc_after = greedy_accuracy(sampler, tok, held_out)
    console.print(
        f"sampled reward: first {k} steps {first:.3f} -> last {k} steps {last:.3f}; "
        f"held-out greedy accuracy ({len(held_out)} problems): {acc_before:.3f} -> {acc_after:.3f} "
        f"({args.steps} steps in {elapsed:.1f}s)"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "first": first,
                    "last": last,
                    "acc_before": acc_before,
                    "acc_after": acc_after,
                    "history": history,
                }
            )
        )
    return 0 if acc_after > acc_before else 1


if __name__ == "__main__":
    raise SystemExit(main())
