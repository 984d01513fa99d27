"""`astraflow train` end to end on the CPU: real services, real HTTP, real training steps."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SMALL = [
    "run.max_steps=4",
    "tasks.group_size=4",
    "policies.policy.trainer.groups_per_step=2",
    "policies.policy.trainer.checkpoint_every=2",
    "rollout.concurrency=16",
    "evaluation.every_steps=2",
    "evaluation.num_tasks=16",
]


def _train(
    output_dir: Path, *extra: str, recipe: str = "recipes/quickstart.toml", timeout: float = 600
):
    sets = []
    for s in [*SMALL, f"run.output_dir={json.dumps(str(output_dir))}", *extra]:
        sets += ["--set", s]
    return subprocess.run(
        [sys.executable, "-m", "cli.main", "train", recipe, "--no-live", *sets],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is not running anything
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _records(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, filter(None, lines)) if r.get("type") == kind]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    proc = _train(out)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return out / "quickstart", proc


def test_versions_advance_and_steps_are_logged(quick_run):
    run_dir, _ = quick_run
    steps = _records(run_dir, "step")
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert [r["version"] for r in steps] == [1, 2, 3, 4]


def test_run_directory_is_complete(quick_run):
    run_dir, _ = quick_run
    for name in (
        "recipe.toml",
        "metrics.jsonl",
        "dataflow.db",
        "logs/dataflow.log",
        "logs/trainer-policy.log",
        "logs/node-0.log",
        "report/overview.png",
        "report/summary.md",
    ):
        assert (run_dir / name).exists(), name
    evals = _records(run_dir, "eval")
    assert evals and all(0.0 <= e["accuracy"] <= 1.0 and e["n"] == 16 for e in evals)
    ckpts = sorted((run_dir / "checkpoints" / "policy").glob("checkpoint-*"))
    assert ckpts, "no checkpoint written"
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(ckpts[-1])


def test_nodes_follow_versions_by_delta(quick_run):
    run_dir, _ = quick_run
    log = (run_dir / "logs" / "node-0.log").read_text()
    assert "(delta)" in log, log[-3000:]


def test_every_task_consumed_once(quick_run):
    run_dir, _ = quick_run
    db = sqlite3.connect(run_dir / "dataflow.db")
    # no sample was served in two acknowledged batches, and no task produced two accepted groups
    dup_groups = db.execute(
        "SELECT task_id, policy, COUNT(*) FROM groups GROUP BY task_id, policy HAVING COUNT(*) > 1"
    ).fetchall()
    assert dup_groups == []


def test_no_process_left(quick_run):
    run_dir, _ = quick_run
    pids = json.loads((run_dir / "pids.json").read_text())
    assert set(pids) == {"dataflow", "trainer-policy", "node-0"}
    assert [name for name, pid in pids.items() if _alive(pid)] == []


def test_resume_after_trainer_killed(tmp_path):
    """Kill the trainer mid-run; `astraflow train --resume` continues from its checkpoint."""
    import signal
    import time

    sets = [*SMALL, "run.max_steps=8", "policies.policy.trainer.checkpoint_every=2",
            "evaluation.every_steps=0", f"run.output_dir={json.dumps(str(tmp_path))}"]  # fmt: skip
    argv = [sys.executable, "-m", "cli.main", "train", "recipes/quickstart.toml", "--no-live"]
    for s in sets:
        argv += ["--set", s]
    run_dir = tmp_path / "quickstart"
    first = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.time() + 300
        while time.time() < deadline:
            done = (
                [r["step"] for r in _records(run_dir, "step")]
                if (run_dir / "metrics.jsonl").exists()
                else []
            )
            if len(done) >= 3:
                break
            time.sleep(0.2)
        else:
            pytest.fail("the first run never reached step 3")
        pids = json.loads((run_dir / "pids.json").read_text())
        os.kill(pids["trainer-policy"], signal.SIGKILL)
        out, _ = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode != 0 and "trainer-policy failed" in out, out[-2000:]
    before = [r["step"] for r in _records(run_dir, "step")]
    resumed = subprocess.run(
        [*argv, "--resume"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    steps = [r["step"] for r in _records(run_dir, "step")]
    after = steps[len(before) :]
    # the version sequence continues from the newest checkpoint (which may be newer than the last
    # step record: a step can be checkpointed and killed before its acknowledgement)
    assert after == list(range(after[0], 9)), (before, after)
    assert 2 < after[0] <= before[-1] + 1, (before, after)
    assert set(before) | set(after) == set(range(1, 9))
    # no batch was trained on twice: every acknowledged batch id is unique
    ids = [r["batch_id"] for r in _records(run_dir, "step")]
    assert len(ids) == len(set(ids))
    assert [
        n for n, pid in json.loads((run_dir / "pids.json").read_text()).items() if _alive(pid)
    ] == []
