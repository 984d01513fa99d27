"""One rank of the two-process (gloo, CPU) trainer check in test_distributed.py.

Rank 0 owns the batch source (the dataflow stand-in) and the publisher; the batch is shared with
rank 1, each rank trains on its share of the groups, DDP averages the gradients.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from trainer_rollouts import arith_producer  # noqa: E402


def main(out_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    from astraflow.models import load_tokenizer, resolve_model
    from astraflow.recipe.schema import TrainerConfig
    from astraflow.trainer.grpo import build_trainer
    from astraflow.trainer.source import InProcessBatchSource

    torch.manual_seed(0)
    path = resolve_model("builtin:tiny-arith")
    tok = load_tokenizer(path)
    sampler = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    producer = arith_producer(sampler, tok)

    source = InProcessBatchSource(producer=producer)
    published: list[int] = []
    trainer = build_trainer(
        "builtin:tiny-arith",
        TrainerConfig(groups_per_step=3, learning_rate=1e-3),
        source,
        out_dir / "run",
        "policy",
        max_steps=2,
        publish=lambda v, sd: published.append(v),
    )
    version = trainer.run(resume=False)
    rank = trainer.accelerator.process_index
    digest = float(sum(p.detach().double().sum() for p in trainer.model.parameters()))
    (out_dir / f"rank{rank}.json").write_text(
        json.dumps(
            {
                "world": trainer.accelerator.num_processes,
                "version": version,
                "published": published,
                "acks": [[a.trainer_version, a.metrics["samples"]] for a in source.acks],
                "served": len(source.served),
                "param_sum": digest,
            }
        )
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
