"""One rank of tests/trainer/test_rank_share.py (run under torchrun, gloo, CPU)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist

from astraflow.protocol import Batch, Group, Sample
from astraflow.protocol.ranks import RankPayload
from astraflow.trainer.rank_share import share_from_main


def _refuse_pickle(*_a, **_k):
    raise AssertionError("a pickling broadcast was used between ranks")


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    dist.broadcast_object_list = _refuse_pickle  # type: ignore[assignment]
    rank = dist.get_rank()
    sample = Sample(
        policy="p", role="r", task_id="t", episode_id="e", group_id="g",
        tokens=[5, 6, 7, 8], loss_mask=[0, 0, 1, 1], logprobs=[0.0, 0.0, -0.25, -1.5],
        versions=[-1, -1, 3, 3], reward=1.0, advantage=0.5,
    )  # fmt: skip
    batch = Batch(
        id="b1", policy="p", trainer_version=3,
        groups=[Group(id=f"g{i}", task_id="t", policy="p", samples=[sample]) for i in range(3)],
    )  # fmt: skip
    got = [
        share_from_main(RankPayload("ok", batch) if rank == 0 else None, device="cpu"),
        share_from_main(
            RankPayload("exhausted", message="done") if rank == 0 else None, device="cpu"
        ),
    ]
    (out / f"rank{rank}.json").write_text(
        json.dumps(
            {
                "kinds": [p.kind for p in got],
                "message": got[1].message,
                "batch": got[0].batch.model_dump(mode="json") if got[0].batch else None,
                "expected": batch.model_dump(mode="json"),
            }
        )
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
