"""`serve policy --port 0` prints the port it bound, and that address answers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_port_zero_prints_the_bound_port():
    proc = subprocess.Popen(
        [sys.executable, "-m", "astraflow.cli.main", "serve", "policy", "builtin:tiny-arith", "--port", "0",
         "--api-key", "k", "--device", "cpu"],
        cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        seen = []
        url = None
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            m = re.search(r"on (http://127\.0\.0\.1:(\d+))/v1", line)
            if m:
                url, port = m.group(1), int(m.group(2))
        assert url is not None, "".join(seen)
        assert port > 0 and "free port" not in "".join(seen)
        reply = httpx.get(f"{url}/v1/models", headers={"authorization": "Bearer k"}, timeout=10)
        assert reply.status_code == 200 and reply.json()["data"][0]["id"] == "builtin:tiny-arith"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
