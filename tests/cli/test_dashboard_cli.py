"""`astraflow dashboard RUN_DIR` prints an address with the run's token and serves the run's
figures there (read from metrics.jsonl; the service of a finished run is gone)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def test_dashboard_of_a_finished_run_directory(tmp_path):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "run.secret").write_text("s3cret\n")
    step = {"type": "step", "policy": "policy", "step": 1, "time": 1.0, "reward_mean": 0.5}
    (run_dir / "metrics.jsonl").write_text(json.dumps(step) + "\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "astraflow.cli.main", "dashboard", str(run_dir), "--port", "0"],
        cwd=ROOT, env={**os.environ, "COLUMNS": "200"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        line = ""
        while "dashboard at" not in line:
            line = proc.stdout.readline()
            assert line, "dashboard exited before printing its address"
        url = re.search(r"(http://127\.0\.0\.1:\d+)/\?token=s3cret", line).group(1)
        assert httpx.get(f"{url}/api/summary", timeout=10).status_code == 401
        got = httpx.get(f"{url}/api/summary?token=s3cret", timeout=10).json()
        assert got["run"] == "r" and got["live"] is False and got["status"] is None
        assert got["series"]["policies"]["policy"]["reward"] == {"x": [1], "y": [0.5]}
        page = httpx.get(f"{url}/?token=s3cret", timeout=10)
        assert page.status_code == 200 and "uPlot.iife.min.js" in page.text
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_commands_of_a_running_job_name_a_bad_ca_file(tmp_path):
    """status, stop and dashboard open the service's client one way (``astraflow.cli.common``): a CA file
    that cannot be read is one line naming the flag, never a traceback (dashboard's was)."""
    missing = tmp_path / "nope.pem"
    for args in (
        ["status", "https://127.0.0.1:9", "--token", "t", "--once"],
        ["stop", "https://127.0.0.1:9", "--token", "t"],
        ["dashboard", "https://127.0.0.1:9", "--token", "t"],
    ):
        out = subprocess.run(
            [sys.executable, "-m", "astraflow.cli.main", *args, "--ca-file", str(missing)],
            cwd=ROOT, env={**os.environ, "COLUMNS": "200"},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 1, (args, out.stderr)
        assert "Traceback" not in out.stderr, (args, out.stderr[-2000:])
        assert "--ca-file" in out.stderr and "nope.pem" in out.stderr, (args, out.stderr)
