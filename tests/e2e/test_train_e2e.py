"""`astraflow train` end to end on the CPU: the helpers the whole-run tests share (start a small
quickstart, wait for a step, SIGKILL a service, check the final timeline).

The whole runs themselves are shared: tests/e2e/conftest.py ``quickstart_run`` (checked in
test_quickstart_run.py) and the kill/stop/Ctrl-C/resume run of test_restart_run.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from astraflow.dataflow.storage import history, store

# whole training runs (train CLI, kills and restarts): slow tier
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

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
        [sys.executable, "-m", "astraflow.cli.main", "train", recipe, "--no-live", *sets],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
    )


def _records(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, filter(None, lines)) if r.get("type") == kind]


def _wait_for_step(run_dir: Path, step: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    import time

    deadline = time.time() + timeout
    while time.time() < deadline:
        if (run_dir / "metrics.jsonl").exists() and any(
            r["step"] >= step for r in _records(run_dir, "step")
        ):
            return
        if proc.poll() is not None:
            pytest.fail(f"the run ended before step {step}: {proc.stdout.read()[-3000:]}")
        time.sleep(0.2)
    pytest.fail(f"the run never reached step {step}")


def _start(tmp_path: Path, *extra: str) -> tuple[list[str], subprocess.Popen]:
    sets = [*SMALL, "run.max_steps=8", "policies.policy.trainer.checkpoint_every=3",
            f"run.output_dir={json.dumps(str(tmp_path))}", *extra]  # fmt: skip
    argv = [
        sys.executable,
        "-m",
        "astraflow.cli.main",
        "train",
        "recipes/quickstart.toml",
        "--no-live",
    ]
    for s in sets:
        argv += ["--set", s]
    proc = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    return argv, proc


def _kill_at_step(run_dir: Path, proc: subprocess.Popen, step: int, service: str) -> None:
    """SIGKILL ``service`` of the run once step ``step`` is recorded."""
    import signal

    _wait_for_step(run_dir, step, proc)
    os.kill(json.loads((run_dir / "pids.json").read_text())[service], signal.SIGKILL)


def _fail_then_resume(
    run_dir: Path, argv: list[str], proc: subprocess.Popen, step: int, service: str
) -> list[dict]:
    """With restarts off, killing ``service`` at ``step`` fails the run; ``--resume`` must then
    finish it at exactly 12 steps. Returns the step records as they were before the resume."""
    try:
        _kill_at_step(run_dir, proc, step, service)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0 and f"{service} failed" in out, out[-2000:]
    before = _records(run_dir, "step")
    resumed = subprocess.run(
        [*argv, "--resume"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    _assert_exact_timeline(run_dir, max_steps=12)
    return before


def _assert_exact_timeline(run_dir: Path, max_steps: int) -> None:
    """The final timeline: steps 1..max_steps once each, version == step, each batch once (in
    metrics.jsonl and in the store), the weights at version max_steps, and evaluations only of
    versions of this timeline, each version once."""
    steps = _records(run_dir, "step")
    assert [r["step"] for r in steps] == list(range(1, max_steps + 1))
    assert all(r["version"] == r["step"] for r in steps)
    ids = [r["batch_id"] for r in steps]
    assert len(ids) == len(set(ids))
    with store.read_only(run_dir / "dataflow.db") as tx:
        batches, versions = history.batches(tx), history.versions(tx)
    acked = sorted((b.step, b.id) for b in batches if b.state == "acked")
    assert [s for s, _ in acked] == list(range(1, max_steps + 1))
    assert [b for _, b in acked] == ids
    assert max(v.version for v in versions) == max_steps
    # no task lost: every training task is done, or pending/leased for a later step (the
    # dataflow's audit: no task leased without a live lease)
    audit = _records(run_dir, "run_summary")[-1]["audit"]
    assert audit["lost"]["orphaned"] == [], audit
    evals = [r["version"] for r in _records(run_dir, "eval")]
    assert len(evals) == len(set(evals)) and set(evals) <= set(range(0, max_steps + 1))


# a stopped run cannot be resumed, so `astraflow stop` gets a run of its own
def test_astraflow_stop_ends_a_run_with_a_checkpoint_and_every_service_exiting_0(tmp_path):
    """`astraflow stop URL --token SECRET` mid-run: the trainer checkpoints the step it reached
    (checkpoint_every is past the run, so only the stop writes one) and exits 0, the node drains
    and exits 0, the launcher ends with every service's exit code 0."""
    _, proc = _start(tmp_path, "run.max_steps=200", "policies.policy.trainer.checkpoint_every=1000")
    run_dir = tmp_path / "quickstart"
    try:
        _wait_for_step(run_dir, 2, proc)
        url = (run_dir / "dataflow.url").read_text().strip()
        stopped = subprocess.run(
            [sys.executable, "-m", "astraflow.cli.main", "stop", url, "--reason", "test stop",
             "--token", (run_dir / "run.secret").read_text().strip()],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert stopped.returncode == 0 and "run stopped: test stop" in stopped.stdout, (
            stopped.stdout + stopped.stderr
        )
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert "stopped cleanly" in out, out[-3000:]
    codes = json.loads((run_dir / "exit_codes.json").read_text())
    assert codes and set(codes.values()) == {0}, codes  # 0, not the -15 a plain SIGTERM leaves
    assert any(name.startswith("node-") for name in codes) and "trainer-policy" in codes
    last_step = max(r["step"] for r in _records(run_dir, "step"))
    assert 2 <= last_step < 200
    ckpts = [p.name for p in (run_dir / "checkpoints" / "policy").glob("checkpoint-*")]
    assert ckpts == [f"checkpoint-{last_step}"], ckpts
    assert "finished training" in (run_dir / "logs" / "trainer-policy.log").read_text()
