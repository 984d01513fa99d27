"""The device check: real training steps of a Qwen2-shaped model on one GPU, as JSON.

``bash tests/gpu/check.sh`` runs it (this file is ``tests/gpu/gpu_check.py``) on a lent H100/H200 (with the torch installed there, nothing
downloaded): a model of ~0.5B parameters with random weights built from a Qwen2 config, the
built-in character tokenizer (saved beside it), rollouts by the transformers engine on the GPU
(behaviour log-probs as a node records them), then N steps of the AstraFlow trainer (fp32 master
weights, bf16 autocast, micro-batches by token budget), each version published through the
background publisher into a real weight store and applied back into the engine. It prints one JSON
object: tokens/s of generation, seconds per step, peak GPU memory, the trainer's blocked seconds
per publication and the background publication's seconds.

``--size tiny --device cpu`` runs the same code on a CPU in seconds; a fast-tier test does, so the
script is known to work before GPU time is spent on it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: Qwen2 shapes: ``0.5b`` is Qwen2.5-0.5B's (494M parameters with its 151,936 vocabulary)
SIZES: dict[str, dict[str, int]] = {
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, vocab_size=151936),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=4096),
}  # fmt: skip


def build_model(size: str, out: Path) -> Path:
    """A random-weight Qwen2 checkpoint with the built-in tokenizer, saved under ``out``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from astraflow.models.tokenizer import build_tokenizer

    tokenizer = build_tokenizer(model_max_length=4096)
    config = Qwen2Config(
        **SIZES[size],
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def rollouts(engine: Any, tokenizer: Any, *, policy: str, groups: int, group_size: int,
             max_tokens: int, version: int, seed: int) -> tuple[Any, int, float]:  # fmt: skip
    """``groups`` groups sampled by ``engine``: (Batch, generated tokens, seconds)."""
    from astraflow.protocol import Batch, Group, Sample, new_id
    from astraflow.rollout.engines.base import SamplingParams

    rng = random.Random(seed)
    params = SamplingParams(n=group_size, temperature=1.0, max_tokens=max_tokens)

    async def one(question: str) -> Group:
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        gens = await engine.generate(prompt_ids, params)
        gid, tid = new_id("grp"), new_id("task")
        samples = [
            Sample(
                policy=policy, role="agent", task_id=tid, episode_id=new_id("ep"), group_id=gid,
                tokens=prompt_ids + g.token_ids,
                loss_mask=[0] * len(prompt_ids) + [1] * len(g.token_ids),
                logprobs=[0.0] * len(prompt_ids) + list(g.logprobs),
                versions=[-1] * len(prompt_ids) + [g.version] * len(g.token_ids),
                reward=float(sum(t % 7 == 0 for t in g.token_ids)) / max(1, len(g.token_ids)),
            )
            for g in gens
        ]  # fmt: skip
        rewards = [s.reward for s in samples]
        return Group(id=gid, task_id=tid, policy=policy, samples=samples,
                     reward_mean=statistics.fmean(rewards),
                     reward_std=statistics.pstdev(rewards))  # fmt: skip

    async def all_groups() -> list[Group]:
        questions = [f"{rng.randint(0, 999)}+{rng.randint(0, 999)}" for _ in range(groups)]
        return await asyncio.gather(*(one(q) for q in questions))

    started = time.perf_counter()
    made = asyncio.run(all_groups())
    seconds = time.perf_counter() - started
    tokens = sum(sum(s.loss_mask) for g in made for s in g.samples)
    batch = Batch(id=new_id("batch"), policy=policy, trainer_version=version, groups=made)
    return batch, tokens, seconds


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size", choices=sorted(SIZES), default="0.5b")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--groups", type=int, default=8, help="groups per step")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=256, help="generated tokens per sample")
    ap.add_argument("--dtype", default="bfloat16", help="trainer compute dtype (autocast)")
    ap.add_argument("--out", type=Path, help="also write the JSON here")
    args = ap.parse_args(argv)

    import torch

    from astraflow.recipe.schema import TrainerConfig
    from astraflow.rollout.engines import make_engine
    from astraflow.trainer.grpo import build_trainer
    from astraflow.trainer.source import InProcessBatchSource
    from astraflow.weights.publisher import BackgroundPublisher
    from astraflow.weights.store import WeightStore
    from astraflow.weights.update import WeightUpdate

    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --size tiny --device cpu for the CPU proof")
    with tempfile.TemporaryDirectory(prefix="astraflow-gpu-check-") as tmp:
        root = Path(tmp)
        model_dir = build_model(args.size, root / "model")
        params = None
        engine = make_engine(
            "transformers", str(model_dir), device=args.device,
            dtype="bfloat16" if cuda else "float32",
        )  # fmt: skip
        gen_tokens, gen_seconds = [], []
        version_of_engine = [0]
        store = WeightStore(root / "weights")
        applied: list[float] = []

        def publish(version: int, state: dict[str, Any]) -> None:
            store.publish("policy", version, state, copy=False)
            started = time.perf_counter()  # the node's side: the engine loads the new version
            asyncio.run(engine.load_weights(WeightUpdate(version=version, full=state)))
            applied.append(time.perf_counter() - started)
            version_of_engine[0] = version

        background = BackgroundPublisher(publish, name="check")

        def producer(policy: str, num_groups: int, version: int):
            background.flush()  # on-policy: the engine holds the newest version
            batch, tokens, seconds = rollouts(
                engine, engine.tokenizer, policy=policy, groups=num_groups,
                group_size=args.group_size, max_tokens=args.max_tokens, version=version,
                seed=version,
            )  # fmt: skip
            gen_tokens.append(tokens)
            gen_seconds.append(seconds)
            return batch

        source = InProcessBatchSource(producer=producer)
        config = TrainerConfig(
            groups_per_step=args.groups, learning_rate=1e-6, device=args.device,
            dtype=args.dtype, checkpoint_every=10_000,
        )  # fmt: skip
        step_times: list[float] = []
        blocked: list[float] = []
        last = [time.perf_counter()]

        def on_step(report) -> None:
            now = time.perf_counter()
            step_times.append(now - last[0])
            last[0] = now
            blocked.append(report.metrics.get("time/publish_s", float("nan")))

        trainer = build_trainer(
            str(model_dir), config, source, root / "run", "policy", max_steps=args.steps,
            publish=background, on_step=on_step,
        )  # fmt: skip
        params = sum(p.numel() for p in trainer.model.parameters())
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        trainer.run(resume=False)
        background.close()
        total = time.perf_counter() - started
        master_dtypes = sorted({str(p.dtype) for p in trainer.model.parameters()})
        result = {
            "check": "gpu",
            "device": torch.cuda.get_device_name() if cuda else "cpu",
            "torch": torch.__version__,
            "size": args.size,
            "params": params,
            "steps": args.steps,
            "groups_per_step": args.groups,
            "group_size": args.group_size,
            "max_tokens": args.max_tokens,
            "compute_dtype": args.dtype,
            "master_dtypes": master_dtypes,
            "generation_tokens_per_s": sum(gen_tokens) / sum(gen_seconds),
            # the first step also compiles and warms the allocator: the median of the rest
            "seconds_per_step": statistics.median(step_times[1:] or step_times),
            "seconds_total": total,
            "peak_gpu_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
            "trainer_blocked_publish_s": statistics.median(blocked[1:] or blocked),
            "background_publish_s": background.stats.publish_s,
            "engine_load_s": statistics.median(applied[1:] or applied),
            "engine_version": version_of_engine[0],
            "store_versions": store.versions("policy"),
        }
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    main()
