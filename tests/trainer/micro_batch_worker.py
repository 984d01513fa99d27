"""One run (1 process, or one rank under torchrun) of the micro-batch check under DDP in
test_micro_batches.py: the same ragged batches, trained with a token budget (each rank then
holds its own number of micro-batches) or in one pass; rank 0 writes the final weights."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_micro_batches import POLICY, ragged_groups  # noqa: E402
from trainer_rollouts import make_batch  # noqa: E402

STEPS = 2


def main(out_dir: Path, tag: str, budget: int) -> None:
    from safetensors.torch import save_file

    from astraflow.recipe.schema import TrainerConfig
    from astraflow.trainer.grpo import build_trainer
    from astraflow.trainer.source import InProcessBatchSource

    torch.set_num_threads(1)
    torch.manual_seed(0)
    source = InProcessBatchSource()
    for step in range(STEPS):
        source.put(make_batch(ragged_groups(step, version=0), POLICY, 0))
    source.close()
    cfg = TrainerConfig(
        groups_per_step=2, learning_rate=1e-3, loss_type="dapo", micro_batch_tokens=budget,
        extra={"optim": "sgd"},
    )  # fmt: skip
    trainer = build_trainer(
        "builtin:tiny-arith", cfg, source, out_dir / f"run-{tag}", POLICY, max_steps=STEPS,
        publish_on_start=False,
    )  # fmt: skip
    trainer.run(resume=False)
    acc = trainer.accelerator
    state = {
        k: v.detach().contiguous().clone()
        for k, v in acc.unwrap_model(trainer.model).state_dict().items()
    }
    save_file(state, str(out_dir / f"{tag}-rank{acc.process_index}.safetensors"))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
