"""Run a trainer test's worker processes (plain or under torchrun) to completion, in their own
process group, so a hang kills torchrun's ranks too, not only torchrun."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

#: torchrun with two local ranks (gloo on CPU); append the worker script and its arguments.
TORCHRUN_2 = [
    sys.executable,
    "-m",
    "torch.distributed.run",
    "--standalone",
    "--nproc_per_node",
    "2",
]


def run_to_completion(argv: list[str], timeout: float) -> str:
    """Run ``argv``; fail the test (with the output's tail) if it hangs or exits non-zero."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{argv[:4]} hung:\n{out[-4000:]}")
    if proc.returncode != 0:
        pytest.fail(f"{argv[:4]} failed ({proc.returncode}):\n{out[-4000:]}")
    return out
