"""One run (1 process, or one rank under torchrun) of the 1-vs-2-process equivalence check.

The batches are generated up front from a fixed seed, so every run trains on the same global
batches whatever its process count; rank 0 (or the single process) writes the final weights and
what it published.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from trainer_rollouts import arith_prompts, make_batch, rollout_group  # noqa: E402

STEPS = 2
GROUPS = 3  # odd: under 2 processes one rank also carries inert padding rows


def main(out_dir: Path, tag: str, optim: str) -> None:
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from astraflow.models import load_tokenizer, resolve_model
    from astraflow.recipe.schema import TrainerConfig
    from astraflow.trainer.grpo import build_trainer
    from astraflow.trainer.source import InProcessBatchSource

    torch.set_num_threads(1)
    torch.manual_seed(0)
    path = resolve_model("builtin:tiny-arith")
    tok = load_tokenizer(path)
    sampler = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    source = InProcessBatchSource()
    for step in range(STEPS):
        groups = [
            rollout_group(sampler, tok, q, a, policy="policy", group_size=4, version=0)
            for q, a in arith_prompts(GROUPS, seed=step)
        ]
        batch = make_batch(groups, "policy", 0)
        source.put(batch.model_copy(update={"id": f"batch-{step}"}))
    source.close()
    published: list[int] = []
    cfg = TrainerConfig(groups_per_step=GROUPS, learning_rate=1e-3, extra={"optim": optim})
    trainer = build_trainer("builtin:tiny-arith", cfg, source, out_dir / f"run-{tag}", "policy",
                            max_steps=STEPS, publish=lambda v, sd: published.append(v))  # fmt: skip
    version = trainer.run(resume=False)
    acc = trainer.accelerator
    state = {
        k: v.detach().contiguous().clone()
        for k, v in acc.unwrap_model(trainer.model).state_dict().items()
    }
    rank = acc.process_index
    save_file(state, str(out_dir / f"{tag}-rank{rank}.safetensors"))
    (out_dir / f"{tag}-rank{rank}.json").write_text(json.dumps({
        "world": acc.num_processes, "version": version, "published": published,
        "acks": [[a.batch_id, a.trainer_version, a.metrics.get("samples")] for a in source.acks],
    }))  # fmt: skip


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
