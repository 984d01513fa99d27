"""The comparison benchmarks' parsing and timing logic (``bench/_records.py``, ``_stats``,
``_results``, ``_runs``, ``_report``), on synthetic
records in the exact format the dataflow service writes, and on a real dataflow SQLite store; no
training run is needed. The benchmarks themselves (``bench/vs_trl.py``,
``bench/multi_policy.py``) run the whole system and are not timed tests."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import _records  # noqa: E402
import _report  # noqa: E402
import _results  # noqa: E402
import _runs  # noqa: E402
import _stats  # noqa: E402

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
    assert _records.parse_jsonl(text) == [{"type": "step", "step": 1}, {"type": "eval"}]


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
    pts = _records.eval_points(records, "p", T0)
    assert [(p.step, p.t, p.accuracy) for p in pts] == [
        (0, 0.0, 0.10),
        (2, 20.0, 0.30),
        (3, 30.0, 0.40),
        (9, 50.0, 0.5),
    ]


def test_time_to_accuracy_is_the_first_crossing():
    pts = [
        _records.EvalPoint(0, 0.0, 0.1),
        _records.EvalPoint(10, 40.0, 0.35),
        _records.EvalPoint(20, 80.0, 0.3),
    ]
    assert _records.time_to_accuracy(pts, 0.3) == 40.0
    assert _records.time_to_accuracy(pts, 0.35) == 40.0
    assert _records.time_to_accuracy(pts, 0.05) == 0.0
    assert _records.time_to_accuracy(pts, 0.5) is None
    assert _records.time_to_accuracy([], 0.1) is None


def test_idle_fraction_counts_the_gaps_between_ack_and_next_batch():
    # busy 0-10, wait 10-30, busy 30-40, wait 40-45, busy 45-50: idle 25 of 50
    spans = [(30.0, 40.0), (0.0, 10.0), (45.0, 50.0)]
    assert _records.idle_fraction(spans) == pytest.approx(0.5)
    assert _records.idle_fraction([(0.0, 10.0), (10.0, 20.0)]) == 0.0
    assert _records.idle_fraction([]) is None
    assert _records.idle_fraction([(5.0, 5.0)]) is None


def test_spread_and_ratio():
    s = _stats.spread([3.0, None, 1.0, float("nan"), 2.0])
    assert (s.median, s.lo, s.hi, s.n) == (2.0, 1.0, 3.0, 3)
    assert s.text("{:.1f}", "s") == "2.0s [1.0–3.0]"
    assert _stats.spread([]).median is None and _stats.spread([]).text() == "-"
    assert _stats.ratio(3.0, 2.0) == 1.5
    assert _stats.ratio(None, 2.0) is None and _stats.ratio(1.0, 0.0) is None


def test_threshold_is_the_lowest_median_final_accuracy_above_the_start():
    finals = {"trl": [0.40, 0.50, 0.45], "async": [0.60, 0.55, 0.70], "sync": [0.52]}
    assert _stats.choose_threshold(finals, accuracy_before=0.2) == pytest.approx(0.45)
    assert _stats.choose_threshold(finals, accuracy_before=0.45) is None  # nothing was learnt
    assert _stats.choose_threshold({"trl": [None], "async": [0.6]}, 0.1) is None
    assert _stats.choose_threshold({}, 0.1) is None


def test_summarize_policy_from_metrics_records():
    records = [evaluation("p", 0, 0.1, 3.0)]
    records += [step("p", n, 10.0 * n, reward=0.1 * n) for n in range(1, 11)]
    records += [evaluation("p", 10, 0.6, 110.0), step("q", 1, 5.0)]
    res = _results.summarize_policy(records, "p", T0, intervals=[(0.0, 10.0), (20.0, 30.0)])
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
    reported = _results.summarize_policy(records, "p", T0).extra["idle_fraction_reported"]
    assert reported == pytest.approx(10 * 2.5 / 100.0)
    assert _records.policies_in(records) == ["p", "q"]
    assert json.loads(json.dumps(res.to_json()))["evals"][1] == {
        "step": 10,
        "t": 100.0,
        "accuracy": 0.6,
    }


def test_dataflow_times_come_from_the_last_run_summary_record():
    """The clock of a finished run is the ``run_summary`` record the dataflow writes as it stops
    (``astraflow/dataflow/storage/run_summary.py``); a restarted service's later record wins."""
    first = {"type": "run_summary", "first_version_at": 99.0, "batches": {}, "train_episodes": 1}
    last = {
        "type": "run_summary",
        "first_version_at": 105.0,
        "first_lease_at": 101.0,
        "train_episodes": 64,
        "batches": {"p": [[110.0, 120.0], [130.0, 140.0]]},
        "status": {"episodes": 80},
    }
    times = _records.dataflow_times([first, step("p", 1, 20.0), last])
    assert times.first_version == 105.0 and times.first_lease == 101.0
    assert times.training_start == 101.0
    assert times.batches == {"p": [(110.0, 120.0), (130.0, 140.0)]}
    assert (times.train_episodes, times.episodes) == (64, 80)
    assert _records.idle_fraction(times.batches["p"]) == pytest.approx(10.0 / 30.0)
    assert _records.dataflow_times([step("p", 1, 20.0)]).training_start is None


@pytest.mark.slow
def test_run_subprocess_stops_the_whole_process_group_on_timeout(tmp_path, still_running):
    pid_file = tmp_path / "child.pid"
    script = (
        "import subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(c.pid))\n"
        "time.sleep(120)\n"
    )
    started = time.time()
    outcome = _runs.run_subprocess(
        [sys.executable, "-c", script], tmp_path / "log.txt", timeout_s=3.0, env=_runs.child_env()
    )
    assert outcome.timed_out and time.time() - started < 60
    child = int(pid_file.read_text())
    deadline = time.time() + 10
    while time.time() < deadline and still_running({"child": child}):
        time.sleep(0.1)
    assert not still_running({"child": child}), (
        "a grandchild in the run's process group survived the timeout"
    )


def test_write_json_serialises_results(tmp_path):
    res = _results.RunResult("trl", 0, ok=True, wall_s=1.0)
    res.policies["policy"] = _results.PolicyResult(
        "policy", evals=[_records.EvalPoint(0, 0.0, 0.5)]
    )
    out = _report.write_json(tmp_path / "sub" / "r.json", {"run": res.to_json(), "path": tmp_path})
    data = json.loads(out.read_text())
    assert data["run"]["policies"]["policy"]["accuracy_before"] == 0.5
    assert data["path"] == str(tmp_path)


def test_missing_final_evals_names_policies_whose_last_step_was_not_evaluated():
    records = [evaluation("p", 0, 0.1, 1.0), step("p", 1, 10.0), step("p", 2, 20.0)]
    records += [evaluation("p", 2, 0.3, 25.0), step("q", 1, 5.0), step("q", 2, 15.0)]
    records += [evaluation("q", 0, 0.1, 1.0), {"type": "eval", "policy": "q", "step": 2}]
    assert _records.missing_final_evals(records) == {
        "q": (2, T0 + 15.0)
    }  # no accuracy: not evaluated
    fixed = records + [_runs._bench_eval("q", 2, 0.5, T0 + 15.0)]
    assert _records.missing_final_evals(fixed) == {}
    assert [(e.step, e.t) for e in _records.eval_points(fixed, "q", T0)] == [(0, 0.0), (2, 15.0)]


def test_censored_spread_ranks_never_reached_above_every_time():
    assert _stats.censored_spread([10.0, None, 20.0]).median == 20.0
    s = _stats.censored_spread([10.0, None, None])
    assert s.median is None and s.lo == 10.0 and s.hi is None and s.n == 3
    assert _stats.censored_spread([30.0, 10.0]).median == 20.0
    assert _stats.censored_spread([]).median is None
    assert _stats.censored_spread([10.0, 12.0, None]).text("{:.0f}", "s") == "12s [10–never]"


def test_training_finished_waits_for_final_steps_then_evals_or_grace(tmp_path):
    path = tmp_path / "metrics.jsonl"

    def write(records):
        path.write_text("".join(json.dumps(r) + "\n" for r in records))

    done = _runs.training_finished(path, ["p", "q"], max_steps=2, eval_grace_s=3600.0)
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
    impatient = _runs.training_finished(path, ["p", "q", "r"], max_steps=0, eval_grace_s=-1.0)
    assert impatient()  # r has no step but max_steps 0 is reached; no grace to wait


def test_run_subprocess_stops_a_process_once_finished(tmp_path):
    marker = tmp_path / "ready"
    script = f"import pathlib, time\npathlib.Path({str(marker)!r}).touch()\ntime.sleep(120)\n"
    outcome = _runs.run_subprocess(
        [sys.executable, "-c", script],
        tmp_path / "log.txt",
        timeout_s=60.0,
        env=_runs.child_env(),
        finished=marker.exists,
        poll_s=0.1,
    )
    assert outcome.stopped_when_finished and not outcome.timed_out
    assert outcome.wall_s < 30 and outcome.returncode is not None


def test_saved_runs_reload_for_reanalysis():
    """``vs_trl.py --from-json`` re-analyses saved runs: a run survives its JSON round trip."""
    records = [step("policy", 1, 5.0), step("policy", 2, 9.0, reward=0.75)]
    records.append({"type": "eval", "policy": "policy", "step": 2, "accuracy": 0.4, "time": 0})
    run = _results.RunResult("astraflow_async", 3, True, 42.0, startup_s=4.0, run_dir="/x", t0=T0)
    run.policies["policy"] = _results.summarize_policy(records, "policy", T0)
    run.policies["policy"].extra["episodes"] = 128
    again = _results.RunResult.from_json(json.loads(json.dumps(run.to_json())))
    assert again == run
    assert again.policies["policy"].accuracy_final == 0.4
    assert _records.time_to_accuracy(again.policies["policy"].evals, 0.4) == 9.0


def test_a_journal_keeps_finished_runs_and_skips_them_when_run_again(tmp_path):
    """``agentic.py --journal``: a bench stopped part-way runs only what it had not finished, and
    a journal written under other settings is refused."""
    path = tmp_path / "journal.jsonl"
    settings = {"steps": 20, "seeds": 8}
    calls: list[tuple[str, int]] = []

    def job(system: str, seed: int, ok: bool = True):
        def run() -> _results.RunResult:
            calls.append((system, seed))
            result = _results.RunResult(system, seed, ok, 10.0 + seed, t0=T0)
            result.policies["policy"] = _results.summarize_policy(
                [step("policy", 1, 5.0)], "policy", T0
            )
            return result

        return run

    first = _results.RunJournal(path, settings)
    first.run("math", "trl", 0, job("trl", 0))
    first.run("math", "trl", 1, job("trl", 1, ok=False))  # failed: tried again next time
    assert calls == [("trl", 0), ("trl", 1)]

    again = _results.RunJournal(path, settings)
    assert len(again) == 1
    kept = again.run("math", "trl", 0, job("trl", 0))
    assert kept.to_json() == first.run("math", "trl", 0, job("trl", 0)).to_json()
    again.run("math", "trl", 1, job("trl", 1))
    assert calls == [("trl", 0), ("trl", 1), ("trl", 1)]
    again.run("tools", "trl", 0, job("trl", 0))  # another case is another run
    assert len(_results.RunJournal(path, settings)) == 3

    assert len(_results.RunJournal(path, settings | {"seeds": 5})) == 3  # fewer seeds: reported
    with pytest.raises(SystemExit, match="other settings"):
        _results.RunJournal(path, settings | {"steps": 6})


def test_a_running_run_is_watched_through_its_status_route(tmp_path):
    """``_status.read_status`` finds the service the way the launcher does (``dataflow.url``,
    ``run.secret``) and reads the typed ``/status``; nothing before the service is up."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dataflow"))
    import _status
    from dataflow_helpers import TOKEN, ThreadedService, make_recipe

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert _status.read_status(run_dir) is None
    with ThreadedService(make_recipe(tmp_path), tmp_path / "df.db") as svc:
        (run_dir / "dataflow.url").write_text(svc.url)
        (run_dir / "run.secret").write_text(TOKEN)
        status = _status.read_status(run_dir)
    assert status is not None and status["episodes"] == 0 and "policy" in status["policies"]
    samples = [(0.0, 0), (10.0, 20), (20.0, 50), (30.0, 90)]
    assert _status.window_rate(samples, 10.0, 30.0) == (70 / 20, 70)
    assert _status.window_rate(samples, 11.0, 19.0) == (None, 0)
