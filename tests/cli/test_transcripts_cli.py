"""`astraflow transcripts RUN_DIR` on a finished quickstart: the kept episodes, turn by turn."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "astraflow.cli.main", *args], cwd=ROOT, capture_output=True, text=True,
        timeout=timeout, env={**os.environ, "COLUMNS": "120"},
    )  # fmt: skip


def test_transcripts_of_a_finished_quickstart(tmp_path):
    sets = ["run.max_steps=2", "tasks.group_size=4", "policies.policy.trainer.groups_per_step=2",
            "rollout.concurrency=16", "evaluation.every_steps=0", "logging.report=false",
            "logging.transcripts_per_step=3", f"run.output_dir={json.dumps(str(tmp_path))}"]  # fmt: skip
    args = [a for s in sets for a in ("--set", s)]
    run = cli("train", "recipes/quickstart.toml", "--no-live", *args)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "stopped cleanly" in run.stdout
    # train served the dashboard beside the run on a port it printed (token-protected)
    import re

    served = re.search(r"dashboard at (https?)://127\.0\.0\.1:(\d+)/\S*token=", run.stdout)
    assert served and int(served.group(2)) > 0, run.stdout[:2000]
    run_dir = tmp_path / "quickstart"

    shown = cli("transcripts", str(run_dir), "--limit", "4")
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "step " in out and "reward" in out and "agent (context)" in out
    assert "agent v" in out  # the policy's turn, with the weight version that wrote it
    assert "<|assistant|>" in out  # decoded with the tiny policy's tokenizer, not token ids

    data = json.loads(cli("transcripts", str(run_dir), "--json", "--limit", "50").stdout)
    steps = {t["record"]["step"] for t in data}
    assert steps and all(
        sum(1 for t in data if t["record"]["step"] == s and not t["record"]["failed"]) <= 3
        for s in steps
    )
    first = data[0]
    assert first["record"]["policy"] == {"agent": "policy"}
    assert [t["source"] for t in first["turns"]][:2] == ["context", "policy"]
    one = min(steps)
    only = json.loads(cli("transcripts", str(run_dir), "--json", "--step", str(one)).stdout)
    assert only and {t["record"]["step"] for t in only} == {one}
    none = cli("transcripts", str(run_dir), "--failed")
    assert none.returncode == 0 and "no failed episodes kept" in none.stdout
