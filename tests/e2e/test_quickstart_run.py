"""The shared quickstart run (tests/e2e/conftest.py ``quickstart_run``) checked from every side:
versions and steps, the run directory, delta weight sync, the dataflow's audit, no process left,
two trainer ranks, HTTPS everywhere, TensorBoard scalars, the transcripts CLI and the dashboard.

Each test here was once its own `astraflow train` run (see the module docstrings it replaces:
test_train_e2e, test_train_multiprocess, test_tls, test_tracking, test_transcripts_cli)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_train_e2e import _assert_exact_timeline, _records

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "astraflow.cli.main", *args], cwd=ROOT, capture_output=True, text=True,
        timeout=timeout, env={**os.environ, "COLUMNS": "120"},
    )  # fmt: skip


def _scalars_tb(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


# --- from test_train_e2e.py (quick_run) ---------------------------------------------------------


def test_versions_advance_and_steps_are_logged(quickstart_run):
    steps = _records(quickstart_run.run_dir, "step")
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert [r["version"] for r in steps] == [1, 2, 3, 4]


def test_run_directory_is_complete(quickstart_run):
    run_dir = quickstart_run.run_dir
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


def test_nodes_follow_versions_by_delta(quickstart_run):
    log = (quickstart_run.run_dir / "logs" / "node-0.log").read_text()
    assert "(delta)" in log, log[-3000:]


def test_every_task_consumed_once(quickstart_run):
    # no task lost, no task produced two accepted groups, no sample trained twice: the
    # dataflow's own audit of its store, written as it stopped
    audit = _records(quickstart_run.run_dir, "run_summary")[-1]["audit"]
    assert audit["tasks_lost"] == 0 and audit["tasks_duplicated"] == 0, audit
    assert audit["samples_trained_twice"] == 0, audit


def test_no_process_left(quickstart_run, still_running):
    pids = json.loads((quickstart_run.run_dir / "pids.json").read_text())
    assert set(pids) == {"dataflow", "trainer-policy", "node-0"}
    assert still_running(pids) == []


# --- from test_train_multiprocess.py::test_quickstart_with_two_trainer_processes ----------------


def test_two_trainer_processes_train_each_step_once(quickstart_run):
    run_dir = quickstart_run.run_dir
    _assert_exact_timeline(run_dir, max_steps=4)
    log = (run_dir / "logs" / "trainer-policy.log").read_text()
    assert "trainer rank 1 (rank 0 talks to the dataflow)" in log  # two ranks really ran
    published = re.findall(r"published policy v(\d+)", log)
    assert published == ["0", "1", "2", "3", "4"]  # exactly one publication per step
    # every sample of each global batch was trained (rank 0 reports the gathered count)
    steps = _records(run_dir, "step")
    assert all(r["metrics"]["samples"] == 8.0 for r in steps), [r["metrics"] for r in steps]


# --- from tests/protocol/test_tls.py::test_quickstart_over_tls ----------------------------------


def test_quickstart_over_tls(quickstart_run):
    """`astraflow train` with security.tls: HTTPS everywhere, role tokens, and it trains."""
    run_dir = quickstart_run.run_dir
    assert (run_dir / "dataflow.url").read_text().startswith("https://127.0.0.1:")
    assert (run_dir / "tls" / "ca.pem").is_file()
    # the trainer (trainer token) served weights over HTTPS to the node (node token), which
    # followed every version
    trainer_log = (run_dir / "logs" / "trainer-policy.log").read_text()
    assert "weight server for policy at https://127.0.0.1:" in trainer_log, trainer_log[-2000:]
    node_log = (run_dir / "logs" / "node-0.log").read_text()
    assert "-> v2" in node_log and "-> v4" in node_log, node_log[-2000:]


# --- from tests/launch/test_tracking.py::test_train_writes_tensorboard_scalars ------------------


def test_train_writes_tensorboard_scalars(quickstart_run):
    got = _scalars_tb(quickstart_run.run_dir / "tensorboard")
    assert [s for s, _ in got["policy/reward_mean"]] == [1, 2, 3, 4]
    assert [s for s, _ in got["policy/version"]] == [1, 2, 3, 4]
    assert "policy/staleness_mean" in got and "policy/train/time/publish_s" in got
    assert any(t.startswith("policy/train/") and "loss" in t for t in got)
    assert any(t.startswith("policy/dropped_total/") for t in got)  # zero_variance_filter
    for key in ("episodes_per_s", "tokens_per_s", "weight_sync_s", "weight_fetch_s"):
        assert f"policy/nodes/node-0/{key}" in got, sorted(got)
    # every_steps=2, at_start=false: evaluated at step 2 (and at 4, the last), never at 0
    eval_steps = [s for s, _ in got["policy/eval/arith/test/accuracy"]]
    evals = [r["step"] for r in _records(quickstart_run.run_dir, "eval")]
    assert 2 in eval_steps and set(eval_steps) <= {2, 4} and eval_steps == sorted(evals)


# --- from tests/cli/test_transcripts_cli.py::test_transcripts_of_a_finished_quickstart ----------


def test_train_stops_cleanly_and_serves_the_dashboard(quickstart_run):
    out = quickstart_run.stdout
    assert "stopped cleanly" in out
    # train served the dashboard beside the run on a port it printed; its read-only token is in
    # RUN_DIR/dashboard.url (0600), never in the log (issue 48 #8)
    served = re.search(r"dashboard at (https?)://127\.0\.0\.1:(\d+)/ \(with its token: ", out)
    assert served and int(served.group(2)) > 0, out[:2000]
    assert "token=" not in out
    address = (quickstart_run.run_dir / "dashboard.url").read_text().strip()
    base = f"{served.group(1)}://127.0.0.1:{served.group(2)}/"
    assert address.startswith(base) and "?token=dashboard." in address
    # how it ended stays in the run directory (the finished run's dashboard reads it)
    from astraflow.launch.outcome import read_outcome

    ended = read_outcome(quickstart_run.run_dir)
    assert ended is not None and ended.outcome == "done", ended
    assert ended.services.endswith("stopped cleanly") and set(ended.exit_codes) >= {"dataflow"}


def test_transcripts_of_a_finished_quickstart(quickstart_run):
    run_dir = quickstart_run.run_dir
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
