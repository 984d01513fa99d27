"""The agentic benchmark's analysis (``tests/bench/agentic.py``) on synthetic runs and a real dataflow
SQLite store: episodes in flight, the speed-ups, the accuracy ladder, the straggler bound, the
report and the plot. No training run (the benchmark itself is not a timed test)."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest

from astraflow.dataflow.store import SCHEMA

BENCH = Path(__file__).resolve().parent / "bench"


@pytest.fixture(scope="module")
def agentic():
    sys.path.insert(0, str(BENCH))
    try:
        import agentic as module

        yield module
    finally:
        sys.path.remove(str(BENCH))


def _store(path: Path) -> Path:
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA)
    # lease a: 8 episodes from 100 to 110; lease b: 8 episodes from 105 to 120; an eval lease.
    for lid, issued, pushed, is_eval in (
        ("a", 100, 110, 0),
        ("b", 105, 120, 0),
        ("e", 100, 130, 1),
    ):
        conn.execute(
            "INSERT INTO leases(id, task_id, node_id, issued_at, deadline, state, versions) "
            "VALUES(?, 't', 'n', ?, 999, 'done', '{}')",
            (lid, float(issued)),
        )
        for k in range(8):
            conn.execute(
                "INSERT INTO episodes(id, task_id, lease_id, node_id, is_eval, finish_reason, "
                "rewards, info, created_at) VALUES(?, 't', ?, 'n', ?, 'terminated', '{}', '{}', ?)",
                (f"{lid}{k}", lid, is_eval, float(pushed)),
            )
    conn.execute("INSERT INTO drops(policy, reason, count) VALUES('policy', 'stale', 3)")
    conn.commit()
    conn.close()
    return path


def test_lease_occupancy_counts_training_episodes_over_time(agentic, tmp_path):
    db = _store(tmp_path / "dataflow.db")
    mean, peak, drops = agentic.lease_occupancy(db, 100.0, 120.0)
    # 8 episodes for 10 s + 8 for 15 s over a 20 s window; both leases overlap from 105 to 110.
    assert mean == pytest.approx((8 * 10 + 8 * 15) / 20)
    assert peak == 16
    assert drops == {"policy:stale": 3}
    assert agentic.lease_occupancy(tmp_path / "missing.db", 0, 1) == (None, None, {})


def _run(H, system: str, accs: list[tuple[float, float]], train_s: float, **extra) -> object:
    res = H.PolicyResult("policy", steps=4, trained_samples=512, train_s=train_s,
                         samples_per_s=512 / train_s, idle_fraction=0.5, extra=extra)  # fmt: skip
    res.evals = [H.EvalPoint(i, t, a) for i, (t, a) in enumerate(accs)]
    run = H.RunResult(system, 0, True, train_s + 10, startup_s=5.0, t0=0.0)
    run.policies["policy"] = res
    return run


def test_analysis_report_and_plot(agentic, tmp_path):
    H = agentic.H
    settings = {
        "group_size": 8, "groups_per_step": 16, "max_turns": 3,
        "env_latency": {"distribution": "lognormal", "p50_s": 0.3, "p99_s": 5.0},
    }  # fmt: skip
    runs = [
        _run(
            H,
            "trl",
            [(0, 0.20), (40, 0.22), (80, 0.25)],
            80.0,
            active_per_turn=[[128, 100, 90]],
            env_wait_s_per_step=15.0,
            generate_s_per_step=18.0,
            episodes_in_flight_mean=80,
            episodes_in_flight_max=128,
        ),  # fmt: skip
        _run(H, "astraflow_sync", [(0, 0.20), (30, 0.24), (60, 0.26)], 60.0),
        _run(
            H,
            "astraflow_async",
            [(0, 0.20), (5, 0.23), (10, 0.27)],
            10.0,
            episodes_in_flight_mean=300,
            episodes_in_flight_max=512,
        ),  # fmt: skip
    ]
    summary = agentic.analyse(runs, settings)
    assert summary["trl_final_acc"] == 0.25
    assert summary["speedup_vs_trl"] == pytest.approx(80 / 10)
    assert summary["speedup_async_over_sync"] == pytest.approx(60 / 10)
    assert summary["ladder"][0] == "0.21" and summary["ladder"][-1] == "0.27"
    assert summary["systems"]["astraflow_async"]["time_to_acc"]["0.23"] == 5
    assert summary["systems"]["trl"]["time_to_acc"]["0.26"] is None
    bound = summary["straggler"]
    assert bound["expected_max_s"] == pytest.approx(8.0, rel=0.01)
    assert bound["lockstep_wait_per_step_s"] == pytest.approx(24.0, rel=0.01)
    assert bound["mean_active_per_turn"] == [128, 100, 90]
    agentic.print_report(summary, runs)
    json.dumps(summary)  # the --json payload is plain data
    png = agentic.plot(runs, tmp_path / "agentic.png")
    assert png is not None and png.stat().st_size > 0


def test_recipe_settings_read_the_recipe(agentic):
    s = agentic.recipe_settings(["tasks.env_latency.p99_s=2.0"])
    assert s["env"] == "astraflow/MathMultiTurn-v0" and s["max_turns"] == 3
    assert s["env_latency"]["p99_s"] == 2.0
    assert agentic.latency_distribution(s).quantile(0.99) == pytest.approx(2.0)
