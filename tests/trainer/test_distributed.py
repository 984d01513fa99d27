"""The trainer under torchrun with two CPU processes (gloo): the multi-GPU code path, on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from process_runs import TORCHRUN_2, run_to_completion

WORKER = Path(__file__).resolve().parent / "ddp_worker.py"


@pytest.mark.slow
def test_two_process_training_shares_one_batch_and_commits_once(tmp_path):
    run_to_completion([*TORCHRUN_2, str(WORKER), str(tmp_path)], timeout=240)
    r0 = json.loads((tmp_path / "rank0.json").read_text())
    r1 = json.loads((tmp_path / "rank1.json").read_text())
    assert r0["world"] == r1["world"] == 2
    assert r0["version"] == r1["version"] == 2
    # Only rank 0 talks to the source and the weight store; samples are counted over both ranks.
    assert r0["published"] == [0, 1, 2] and r1["published"] == []
    assert r0["acks"] == [[1, 12.0], [2, 12.0]] and r1["acks"] == [] and r1["served"] == 0
    # DDP kept the replicas identical.
    assert r0["param_sum"] == pytest.approx(r1["param_sum"], abs=1e-9)
