"""Ctrl-C on `astraflow train`: every service stops with SIGTERM in order (nodes release their
leases at once, the dataflow last and not SIGKILLed), a plain summary, exit status 130."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_ctrl_c_stops_in_order_without_sigkill(tmp_path, still_running):
    sets = ["run.max_steps=500", "tasks.group_size=4", "policies.policy.trainer.groups_per_step=2",
            "rollout.concurrency=16", "evaluation.every_steps=0", "logging.report=false",
            f"run.output_dir={json.dumps(str(tmp_path))}"]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "astraflow.cli.main", "train", "recipes/quickstart.toml", "--no-live",
         *[a for s in sets for a in ("--set", s)]],
        cwd=ROOT, env={**os.environ, "COLUMNS": "200"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    metrics = tmp_path / "quickstart" / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics.exists() and metrics.read_text().strip()):  # training has started
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.5)
    pids = json.loads((tmp_path / "quickstart" / "pids.json").read_text())
    asked = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    took = time.monotonic() - asked
    assert proc.returncode == 130, out[-2000:] + err[-2000:]
    assert "stopping (Ctrl-C)" in out
    assert "run interrupted" in out and "all 3 services stopped cleanly" in out, out[-2000:]
    assert "SIGKILL" not in out and "services exited: {" not in out
    assert not still_running(pids)
    # nodes gave their leases back rather than finishing them; the dataflow logged its shutdown
    node_log = (tmp_path / "quickstart" / "logs" / "node-0.log").read_text()
    assert "deregistered" in node_log
    assert took < 60, f"Ctrl-C took {took:.1f}s"  # was ~24 s with a SIGKILLed dataflow
