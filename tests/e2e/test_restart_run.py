"""ONE quickstart run (two trainer processes) taken through every way a run is stopped, killed,
restarted and resumed, each stage checked as it happens; it replaces five whole runs of
test_train_e2e.py, test_train_multiprocess.py and tests/launch/test_ctrl_c.py:

1. restarts on: the dataflow SIGKILLed at step 3, then the two-process trainer (torchrun) at
   step 5: the launcher restarts both; then Ctrl-C: every service stops with SIGTERM in order,
   exit status 130;
3. ``--resume`` with restarts off, the dataflow SIGKILLed: the run fails;
4. ``--resume`` with restarts off, the trainer SIGKILLed: the run fails;
5. ``--resume`` to max_steps: exactly max_steps steps, version == step, each batch once, the steps
   kept before the last kill unchanged, no process left.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from test_train_e2e import _assert_exact_timeline, _kill_at_step, _records, _start, _wait_for_step

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

ROOT = Path(__file__).resolve().parents[2]
TWO = "policies.policy.trainer.processes=2"
MAX_STEPS = 16


def _children(pid: int) -> list[int]:
    """PIDs whose parent is ``pid`` (torchrun's ranks)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _last_step(run_dir: Path) -> int:
    return max(r["step"] for r in _records(run_dir, "step"))


def _ckpts(run_dir: Path) -> set[str]:
    return {p.name for p in (run_dir / "checkpoints" / "policy").glob("checkpoint-*")}


def _finish(proc: subprocess.Popen, timeout: float) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return out


@dataclass
class Stages:
    run_dir: Path
    ranks: list[int] = field(default_factory=list)
    ranks_left_after_kill: list[str] = field(default_factory=list)
    restarts: list[tuple[str, str]] = field(default_factory=list)
    ctrl_c: dict = field(default_factory=dict)
    dataflow_killed: dict = field(default_factory=dict)
    trainer_killed: dict = field(default_factory=dict)
    final: dict = field(default_factory=dict)


@pytest.fixture(scope="module")
def restart_run(tmp_path_factory, still_running) -> Stages:
    out = tmp_path_factory.mktemp("restart-run")
    run_dir = out / "quickstart"
    st = Stages(run_dir)

    # 1. restarts on: kill the dataflow, then the two-process trainer; then Ctrl-C
    argv, proc = _start(out, TWO, "run.restart_backoff_s=0.2", f"run.max_steps={MAX_STEPS}")
    try:
        _kill_at_step(run_dir, proc, 3, "dataflow")
        _wait_for_step(run_dir, 4, proc)
        torchrun = json.loads((run_dir / "pids.json").read_text())["trainer-policy"]
        st.ranks = _children(torchrun)
        _kill_at_step(run_dir, proc, 5, "trainer-policy")
        _wait_for_step(run_dir, 7, proc)  # the restarted trainer trains again
        st.ranks_left_after_kill = still_running({f"rank {i}": p for i, p in enumerate(st.ranks)})
        pids = json.loads((run_dir / "pids.json").read_text())
        asked = time.monotonic()
        proc.send_signal(signal.SIGINT)
        text = _finish(proc, 120)
    finally:
        if proc.poll() is None:
            proc.kill()
    st.ctrl_c = {
        "returncode": proc.returncode, "out": text, "took": time.monotonic() - asked,
        "left": still_running(pids),
        "node_log": (run_dir / "logs" / "node-0.log").read_text(),
    }  # fmt: skip
    events = (run_dir / "restarts.jsonl").read_text().splitlines()
    st.restarts = [(e["event"], e["service"]) for e in map(json.loads, events)]

    # 3. and 4. --resume with restarts off: a SIGKILL of the dataflow, then of the trainer, fails it
    for service, into in (("dataflow", st.dataflow_killed), ("trainer-policy", st.trainer_killed)):
        start = _last_step(run_dir)
        proc = subprocess.Popen(
            [*argv, "--set", "run.max_restarts=0", "--resume"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            _kill_at_step(run_dir, proc, start + 1, service)
            text = _finish(proc, 120)
        finally:
            if proc.poll() is None:
                proc.kill()
        into.update(returncode=proc.returncode, out=text, before=_records(run_dir, "step"))

    # 5. --resume to the end
    resumed = subprocess.run(
        [*argv, "--resume"], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    st.final = {
        "proc": resumed,
        "left": still_running(json.loads((run_dir / "pids.json").read_text())),
    }
    return st


def test_dataflow_and_trainer_killed_mid_run_are_restarted(restart_run):
    """SIGKILL the dataflow, then the trainer: the launcher restarts both (the dataflow from its
    store, the trainer from checkpoint-3, the steps after it replayed)."""
    assert restart_run.restarts == [
        ("crash", "dataflow"), ("restart", "dataflow"),
        ("crash", "trainer-policy"), ("restart", "trainer-policy"),
    ]  # fmt: skip


def test_two_process_trainer_killed_is_restarted_and_its_ranks_die_with_it(restart_run):
    assert len(restart_run.ranks) == 2, restart_run.ranks  # torchrun ran two ranks
    assert restart_run.ranks_left_after_kill == []  # the killed trainer's ranks died with it


def test_ctrl_c_stops_in_order_without_sigkill(restart_run):
    """Ctrl-C on `astraflow train`: every service stops with SIGTERM in order (nodes release their
    leases at once, the dataflow last and not SIGKILLed), a plain summary, exit status 130."""
    c = restart_run.ctrl_c
    out = c["out"]
    assert c["returncode"] == 130, out[-3000:]
    assert "stopping (Ctrl-C)" in out, out[-3000:]
    after = out[out.index("stopping (Ctrl-C)") :]  # the kills before it are the test's own
    assert "run interrupted" in after and "all 3 services stopped cleanly" in after, after[-2000:]
    assert "SIGKILL" not in after and "services exited: {" not in after, after[-2000:]
    assert c["left"] == []
    # nodes gave their leases back rather than finishing them
    assert "deregistered" in c["node_log"]
    assert c["took"] < 60, f"Ctrl-C took {c['took']:.1f}s"  # was ~24 s with a SIGKILLed dataflow


def test_resume_after_the_dataflow_killed_and_after_the_trainer_killed(restart_run):
    """With restarts off, a SIGKILL of the dataflow, then (in the next resume) of the trainer,
    fails the run naming the service."""
    for service, got in (("dataflow", restart_run.dataflow_killed),
                         ("trainer-policy", restart_run.trainer_killed)):  # fmt: skip
        assert got["returncode"] != 0 and f"{service} failed" in got["out"], got["out"][-2000:]


def test_resume_ends_at_max_steps_with_each_step_once(restart_run, still_running):
    """`--resume` after all that continues from the trainer's newest checkpoint (older than the
    steps the dataflow counted), replays the steps after it on the same batches, and ends at
    exactly max_steps with version == step,"""
    final = restart_run.final["proc"]
    assert final.returncode == 0, final.stdout[-3000:] + final.stderr[-3000:]
    run_dir = restart_run.run_dir
    _assert_exact_timeline(run_dir, max_steps=MAX_STEPS)
    # steps up to the checkpoint were kept; the ones after it were trained again on the same batches
    after = {r["step"]: r["batch_id"] for r in _records(run_dir, "step")}
    assert all(after[r["step"]] == r["batch_id"] for r in restart_run.trainer_killed["before"])
    assert restart_run.final["left"] == []
