"""A multi-process trainer stopped by the launcher reads as a clean stop: the torchrun entry point
ends with SIGTERM's status once its ranks are down (plain torchrun exits with status 1)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from astraflow.launch.exits import describe_exit

RANK = """
import os, pathlib, sys, time
pathlib.Path(sys.argv[1], os.environ["RANK"]).write_text(str(os.getpid()))
time.sleep(600)
"""


def _stopped_status(module: str, tmp_path) -> tuple[int, list[int]]:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    marks = tmp_path / module
    marks.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "--standalone", "--nproc_per_node", "2",
         str(script), str(marks)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while len(list(marks.iterdir())) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "ranks never started"
            time.sleep(0.1)
        ranks = [int(p.read_text()) for p in marks.iterdir()]
        proc.send_signal(signal.SIGTERM)
        return proc.wait(60), ranks
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.timeout(180)
def test_sigterm_stops_the_ranks_and_reads_as_a_clean_stop(tmp_path):
    code, ranks = _stopped_status("astraflow.launch.torchrun", tmp_path)
    assert code == -signal.SIGTERM and describe_exit(code) is None
    assert not any(_alive(r) for r in ranks)
    # what the entry point changes: torchrun itself reports the same stop as a failure
    plain, _ = _stopped_status("torch.distributed.run", tmp_path)
    assert plain == 1 and describe_exit(plain) == "exited with status 1"
