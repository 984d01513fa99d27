"""The comparison benchmarks' parsing and timing logic (``tests/bench/_harness.py``), on synthetic
records in the exact format the dataflow service writes, and on a real dataflow SQLite store; no
training run is needed. The benchmarks themselves (``tests/bench/vs_trl.py``,
``tests/bench/multi_policy.py``) run the whole system and are not timed tests."""

from __future__ import annotations

import importlib.util
import json
import os
import sqlite3
import sys
import time
from pathlib import Path

import pytest

from astraflow.dataflow.store import SCHEMA

_PATH = Path(__file__).resolve().parent / "bench" / "_harness.py"
_spec = importlib.util.spec_from_file_location("bench_harness", _PATH)
H = importlib.util.module_from_spec(_spec)
sys.modules["bench_harness"] = H
_spec.loader.exec_module(H)

T0 = 1_000.0


def step(policy: str, n: int, t: float, reward: float = 0.5, samples: int = 64) -> dict:
    return {
        "seq": n,
        "type": "step",
        "policy": policy,
        "step": n,
        "version": n,
        "samples": samples,
        "reward_mean": reward,
        "staleness_mean": 1.0,
        "time": T0 + t,
    }


def evaluation(policy: str, n: int, acc: float, finished: float) -> dict:
    return {"type": "eval", "policy": policy, "step": n, "accuracy": acc, "time": T0 + finished}


def test_parse_jsonl_skips_blank_and_cut_lines():
    text = '{"type": "step", "step": 1}\n\n{"type": "eval", "ste\n[1, 2]\n{"type": "eval"}\n'
    assert H.parse_jsonl(text) == [{"type": "step", "step": 1}, {"type": "eval"}]


def test_eval_points_are_placed_at_the_step_that_produced_the_weights():
    records = [
        evaluation("p", 0, 0.10, finished=4.0),  # step 0: training start, whatever its latency
        step("p", 1, 10.0),
        step("p", 2, 20.0),
        evaluation("p", 2, 0.30, finished=29.0),  # finished later, but the weights date from 20s
        step("p", 3, 30.0),
        evaluation("p", 3, 0.40, finished=39.0),
        evaluation("q", 3, 0.99, finished=1.0),  # another policy
        {"type": "eval", "policy": "p", "step": 9, "accuracy": 0.5, "time": T0 + 50.0},  # no step
    ]
    pts = H.eval_points(records, "p", T0)
    assert [(p.step, p.t, p.accuracy) for p in pts] == [
        (0, 0.0, 0.10),
        (2, 20.0, 0.30),
        (3, 30.0, 0.40),
        (9, 50.0, 0.5),
    ]


def test_time_to_accuracy_is_the_first_crossing():
    pts = [H.EvalPoint(0, 0.0, 0.1), H.EvalPoint(10, 40.0, 0.35), H.EvalPoint(20, 80.0, 0.3)]
    assert H.time_to_accuracy(pts, 0.3) == 40.0
    assert H.time_to_accuracy(pts, 0.35) == 40.0
    assert H.time_to_accuracy(pts, 0.05) == 0.0
    assert H.time_to_accuracy(pts, 0.5) is None
    assert H.time_to_accuracy([], 0.1) is None


def test_idle_fraction_counts_the_gaps_between_ack_and_next_batch():
    # busy 0-10, wait 10-30, busy 30-40, wait 40-45, busy 45-50: idle 25 of 50
    spans = [(30.0, 40.0), (0.0, 10.0), (45.0, 50.0)]
    assert H.idle_fraction(spans) == pytest.approx(0.5)
    assert H.idle_fraction([(0.0, 10.0), (10.0, 20.0)]) == 0.0
    assert H.idle_fraction([]) is None
    assert H.idle_fraction([(5.0, 5.0)]) is None


def test_spread_and_ratio():
    s = H.spread([3.0, None, 1.0, float("nan"), 2.0])
    assert (s.median, s.lo, s.hi, s.n) == (2.0, 1.0, 3.0, 3)
    assert s.text("{:.1f}", "s") == "2.0s [1.0–3.0]"
    assert H.spread([]).median is None and H.spread([]).text() == "-"
    assert H.ratio(3.0, 2.0) == 1.5
    assert H.ratio(None, 2.0) is None and H.ratio(1.0, 0.0) is None


def test_threshold_is_the_lowest_median_final_accuracy_above_the_start():
    finals = {"trl": [0.40, 0.50, 0.45], "async": [0.60, 0.55, 0.70], "sync": [0.52]}
    assert H.choose_threshold(finals, accuracy_before=0.2) == pytest.approx(0.45)
    assert H.choose_threshold(finals, accuracy_before=0.45) is None  # nothing was learnt
    assert H.choose_threshold({"trl": [None], "async": [0.6]}, 0.1) is None
    assert H.choose_threshold({}, 0.1) is None


def test_summarize_policy_from_metrics_records():
    records = [evaluation("p", 0, 0.1, 3.0)]
    records += [step("p", n, 10.0 * n, reward=0.1 * n) for n in range(1, 11)]
    records += [evaluation("p", 10, 0.6, 110.0), step("q", 1, 5.0)]
    res = H.summarize_policy(records, "p", T0, intervals=[(0.0, 10.0), (20.0, 30.0)])
    assert res.steps == 10 and res.trained_samples == 640
    assert res.train_s == 100.0 and res.samples_per_s == pytest.approx(6.4)
    assert res.reward_first == pytest.approx(0.3) and res.reward_final == pytest.approx(0.8)
    assert res.accuracy_before == 0.1 and res.accuracy_final == 0.6 and res.accuracy_best == 0.6
    assert res.idle_fraction == pytest.approx(1 / 3)
    assert res.extra["staleness_mean"] == 1.0
    assert "idle_fraction_reported" not in res.extra  # the trainer reported no batch_wait_s
    for r in records:
        if r["type"] == "step":
            r["metrics"] = {"batch_wait_s": 2.5}
    reported = H.summarize_policy(records, "p", T0).extra["idle_fraction_reported"]
    assert reported == pytest.approx(10 * 2.5 / 100.0)
    assert H.policies_in(records) == ["p", "q"]
    assert json.loads(json.dumps(res.to_json()))["evals"][1] == {
        "step": 10,
        "t": 100.0,
        "accuracy": 0.6,
    }


def test_read_dataflow_times_from_a_store_with_the_services_schema(tmp_path):
    db = tmp_path / "dataflow.db"
    conn = sqlite3.connect(db)
    conn.executescript(SCHEMA)
    conn.execute(
        "INSERT INTO versions(policy, version, body, created_at) VALUES('p', 0, '{}', 105.0)"
    )
    conn.execute(
        "INSERT INTO leases(id, task_id, node_id, issued_at, deadline, state, versions) "
        "VALUES('l1', 't1', 'n1', 101.0, 200.0, 'done', '{}')"
    )
    for i, (created, acked) in enumerate([(110.0, 120.0), (130.0, 140.0), (150.0, None)]):
        conn.execute(
            "INSERT INTO batches(id, policy, trainer_id, trainer_version, layout, summary, state, "
            "created_at, acked_at) VALUES(?, 'p', 'tr', ?, '[]', '{}', 'served', ?, ?)",
            (f"b{i}", i, created, acked),
        )
    conn.commit()
    conn.close()
    times = H.read_dataflow_times(db)
    assert times.first_version == 105.0 and times.first_lease == 101.0
    assert times.training_start == 101.0
    assert times.batches == {"p": [(110.0, 120.0), (130.0, 140.0)]}  # unacked batch left out
    assert H.idle_fraction(times.batches["p"]) == pytest.approx(10.0 / 30.0)
    assert H.read_dataflow_times(tmp_path / "missing.db").training_start is None


@pytest.mark.slow
def test_run_subprocess_stops_the_whole_process_group_on_timeout(tmp_path):
    pid_file = tmp_path / "child.pid"
    script = (
        "import subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(c.pid))\n"
        "time.sleep(120)\n"
    )
    started = time.time()
    outcome = H.run_subprocess(
        [sys.executable, "-c", script], tmp_path / "log.txt", timeout_s=3.0, env=H.child_env()
    )
    assert outcome.timed_out and time.time() - started < 60
    child = int(pid_file.read_text())
    deadline = time.time() + 10
    while time.time() < deadline and _alive(child):
        time.sleep(0.1)
    assert not _alive(child), "a grandchild in the run's process group survived the timeout"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie whose parent is gone counts as dead
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_write_json_serialises_results(tmp_path):
    res = H.RunResult("trl", 0, ok=True, wall_s=1.0)
    res.policies["policy"] = H.PolicyResult("policy", evals=[H.EvalPoint(0, 0.0, 0.5)])
    out = H.write_json(tmp_path / "sub" / "r.json", {"run": res.to_json(), "path": tmp_path})
    data = json.loads(out.read_text())
    assert data["run"]["policies"]["policy"]["accuracy_before"] == 0.5
    assert data["path"] == str(tmp_path)


def test_missing_final_evals_names_policies_whose_last_step_was_not_evaluated():
    records = [evaluation("p", 0, 0.1, 1.0), step("p", 1, 10.0), step("p", 2, 20.0)]
    records += [evaluation("p", 2, 0.3, 25.0), step("q", 1, 5.0), step("q", 2, 15.0)]
    records += [evaluation("q", 0, 0.1, 1.0), {"type": "eval", "policy": "q", "step": 2}]
    assert H.missing_final_evals(records) == {"q": (2, T0 + 15.0)}  # no accuracy: not evaluated
    fixed = records + [H._bench_eval("q", 2, 0.5, T0 + 15.0)]
    assert H.missing_final_evals(fixed) == {}
    assert [(e.step, e.t) for e in H.eval_points(fixed, "q", T0)] == [(0, 0.0), (2, 15.0)]


def test_censored_spread_ranks_never_reached_above_every_time():
    assert H.censored_spread([10.0, None, 20.0]).median == 20.0
    s = H.censored_spread([10.0, None, None])
    assert s.median is None and s.lo == 10.0 and s.hi is None and s.n == 3
    assert H.censored_spread([30.0, 10.0]).median == 20.0
    assert H.censored_spread([]).median is None
    assert H.censored_spread([10.0, 12.0, None]).text("{:.0f}", "s") == "12s [10–never]"


def test_training_finished_waits_for_final_steps_then_evals_or_grace(tmp_path):
    path = tmp_path / "metrics.jsonl"

    def write(records):
        path.write_text("".join(json.dumps(r) + "\n" for r in records))

    done = H.training_finished(path, ["p", "q"], max_steps=2, eval_grace_s=3600.0)
    assert not done()  # no file yet
    write([step("p", 1, 1.0), step("p", 2, 2.0), step("q", 1, 1.0)])
    assert not done()  # q has not finished
    write([step("p", 1, 1.0), step("p", 2, 2.0), step("q", 1, 1.0), step("q", 2, 2.0)])
    assert not done()  # final evaluations not in yet, grace not over
    write(
        [step("p", 2, 2.0), step("q", 2, 2.0), evaluation("p", 2, 0.3, 3.0)]
        + [evaluation("q", 2, 0.2, 3.0)]
    )
    assert done()
    impatient = H.training_finished(path, ["p", "q", "r"], max_steps=0, eval_grace_s=-1.0)
    assert impatient()  # r has no step but max_steps 0 is reached; no grace to wait


def test_run_subprocess_stops_a_process_once_finished(tmp_path):
    marker = tmp_path / "ready"
    script = f"import pathlib, time\npathlib.Path({str(marker)!r}).touch()\ntime.sleep(120)\n"
    outcome = H.run_subprocess(
        [sys.executable, "-c", script],
        tmp_path / "log.txt",
        timeout_s=60.0,
        env=H.child_env(),
        finished=marker.exists,
        poll_s=0.1,
    )
    assert outcome.stopped_when_finished and not outcome.timed_out
    assert outcome.wall_s < 30 and outcome.returncode is not None


def test_saved_runs_reload_for_reanalysis():
    """``vs_trl.py --from-json`` re-analyses saved runs: a run survives its JSON round trip."""
    records = [step("policy", 1, 5.0), step("policy", 2, 9.0, reward=0.75)]
    records.append({"type": "eval", "policy": "policy", "step": 2, "accuracy": 0.4, "time": 0})
    run = H.RunResult("astraflow_async", 3, True, 42.0, startup_s=4.0, run_dir="/x", t0=T0)
    run.policies["policy"] = H.summarize_policy(records, "policy", T0)
    run.policies["policy"].extra["episodes"] = 128
    again = H.RunResult.from_json(json.loads(json.dumps(run.to_json())))
    assert again == run
    assert again.policies["policy"].accuracy_final == 0.4
    assert H.time_to_accuracy(again.policies["policy"].evals, 0.4) == 9.0
