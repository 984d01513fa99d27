"""Trainer ranks share rank 0's batch as msgpack bytes, never through pickle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from process_runs import TORCHRUN_2, run_to_completion

from astraflow.protocol import Batch, Group, Sample
from astraflow.protocol.ranks import RankPayload

WORKER = Path(__file__).resolve().parent / "rank_share_worker.py"


def _batch() -> Batch:
    s = Sample(
        policy="p", role="r", task_id="t", episode_id="e", group_id="g",
        tokens=[1, 2, 3], loss_mask=[0, 1, 1], logprobs=[0.0, -0.5, -0.75],
        versions=[-1, 2, 2], reward=0.5,
    )  # fmt: skip
    return Batch(id="b", policy="p", trainer_version=2, groups=[Group(id="g", task_id="t", policy="p", samples=[s])])  # fmt: skip


def test_payload_round_trips_through_bytes():
    for payload in (
        RankPayload("ok", _batch()),
        RankPayload("exhausted", message="no more tasks"),
        RankPayload("error", message="ConnectError: refused"),
    ):
        assert RankPayload.from_bytes(payload.to_bytes()) == payload


def test_malformed_payload_is_refused_with_what_was_expected():
    from astraflow.protocol.codec import encode_obj

    with pytest.raises(ValueError, match="kind, message, batch"):
        RankPayload.from_bytes(encode_obj({"kind": "pickle"}))


@pytest.mark.slow
def test_two_ranks_receive_rank_zeros_batch_without_pickle(tmp_path):
    run_to_completion([*TORCHRUN_2, str(WORKER), str(tmp_path)], timeout=120)
    sent = json.loads((tmp_path / "rank0.json").read_text())["expected"]
    for rank in (0, 1):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got["kinds"] == ["ok", "exhausted"]
        assert got["message"] == "done"
        assert got["batch"] == sent  # every field, defaults made on rank 0 included
