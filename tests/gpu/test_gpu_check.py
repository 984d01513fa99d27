"""The device check's script runs on the CPU (tiny shapes), so GPU time is never spent finding a
bug in it; on a GPU machine, the `gpu` test runs it at its real size."""

from __future__ import annotations

import pytest
import torch
from gpu_check import main


def test_the_check_trains_publishes_and_loads_versions_on_the_cpu(tmp_path):
    out = tmp_path / "check.json"
    args = ["--size", "tiny", "--device", "cpu", "--steps", "3", "--groups", "2",
            "--group-size", "4", "--max-tokens", "8", "--out", str(out)]  # fmt: skip
    result = main([*args, "--dtype", "float32"])
    assert out.exists() and result["steps"] == 3 and result["params"] > 0
    assert result["store_versions"] == [0, 1, 2, 3] and result["engine_version"] == 3
    assert result["generation_tokens_per_s"] > 0 and result["seconds_per_step"] > 0
    assert result["master_dtypes"] == ["torch.float32"]  # fp32 master weights
    assert result["background_publish_s"] > 0 and result["trainer_blocked_publish_s"] >= 0


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is false)"
)
def test_the_check_on_a_gpu(tmp_path):
    result = main(["--steps", "3", "--out", str(tmp_path / "check.json")])
    assert result["master_dtypes"] == ["torch.float32"] and result["peak_gpu_memory_gib"] > 0
