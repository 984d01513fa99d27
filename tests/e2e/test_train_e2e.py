"""`astraflow train` end to end on the CPU: real services, real HTTP, real training steps."""

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
    # no task lost, no task produced two accepted groups, no sample trained twice: the
    # dataflow's own audit of its store, written as it stopped
    audit = _records(run_dir, "run_summary")[-1]["audit"]
    assert audit["tasks_lost"] == 0 and audit["tasks_duplicated"] == 0, audit
    assert audit["samples_trained_twice"] == 0, audit


def test_no_process_left(quick_run, still_running):
    run_dir, _ = quick_run
    pids = json.loads((run_dir / "pids.json").read_text())
    assert set(pids) == {"dataflow", "trainer-policy", "node-0"}
    assert still_running(pids) == []


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


def test_dataflow_and_trainer_killed_mid_run_are_restarted(tmp_path, still_running):
    """SIGKILL the dataflow, then the trainer: the launcher restarts both (the dataflow from its
    store, the trainer from checkpoint-3 or -6, the steps after it replayed) and the run ends
    with exactly max_steps steps."""
    # 12 steps: the trainer, killed at step 5, must still be training when the signal lands
    _, proc = _start(tmp_path, "run.restart_backoff_s=0.2", "run.max_steps=12")
    run_dir = tmp_path / "quickstart"
    try:
        _kill_at_step(run_dir, proc, 3, "dataflow")
        _kill_at_step(run_dir, proc, 5, "trainer-policy")
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    events = [json.loads(line) for line in (run_dir / "restarts.jsonl").read_text().splitlines()]
    assert [(e["event"], e["service"]) for e in events] == [
        ("crash", "dataflow"), ("restart", "dataflow"),
        ("crash", "trainer-policy"), ("restart", "trainer-policy"),
    ]  # fmt: skip
    _assert_exact_timeline(run_dir, max_steps=12)
    assert still_running(json.loads((run_dir / "pids.json").read_text())) == []


def test_resume_after_the_dataflow_killed_ends_at_max_steps(tmp_path):
    """No restarts allowed: SIGKILL of the dataflow fails the run; `--resume` then restarts the
    trainer from its newest checkpoint, which is older than the steps the dataflow counted, and
    the run still ends at exactly max_steps with version == step."""
    argv, proc = _start(tmp_path, "run.max_restarts=0", "run.max_steps=12")
    _fail_then_resume(tmp_path / "quickstart", argv, proc, 5, "dataflow")


def test_resume_after_trainer_killed(tmp_path, still_running):
    """Kill the trainer mid-run with restarts off; `astraflow train --resume` continues from its
    checkpoint and replays the steps after it."""
    argv, proc = _start(tmp_path, "run.max_restarts=0", "evaluation.every_steps=0",
                        "run.max_steps=12")  # fmt: skip
    run_dir = tmp_path / "quickstart"
    before = _fail_then_resume(run_dir, argv, proc, 4, "trainer-policy")
    # steps up to checkpoint-3 were kept; the ones after it were trained again on the same batches
    after = {r["step"]: r["batch_id"] for r in _records(run_dir, "step")}
    assert all(after[r["step"]] == r["batch_id"] for r in before)
    assert still_running(json.loads((run_dir / "pids.json").read_text())) == []


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
