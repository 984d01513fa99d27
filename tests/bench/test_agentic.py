"""The agentic benchmark's analysis (``bench/agentic.py``) on synthetic runs and a real dataflow
SQLite store: episodes in flight, the speed-ups, the accuracy ladder, the straggler bound, the
report and the plot. No training run (the benchmark itself is not a timed test)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import _records  # noqa: E402
import _results  # noqa: E402

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def agentic():
    sys.path.insert(0, str(BENCH))
    try:
        import agentic as module

        yield module
    finally:
        sys.path.remove(str(BENCH))


def test_lease_occupancy_counts_training_episodes_over_time(agentic):
    # the run_summary record the dataflow writes (training leases only: an eval lease is not in it)
    # lease a: 8 episodes in flight from 100 to 110; lease b: 8 from 105 to 120
    summary = {
        "leases": [["n", 100.0, 110.0, 8], ["n", 105.0, 120.0, 8]],
        "status": {"policies": {"policy": {"dropped": {"stale": 3}}}},
    }
    mean, peak, drops = agentic.lease_occupancy(summary, 100.0, 120.0)
    # 8 episodes for 10 s + 8 for 15 s over a 20 s window; both leases overlap from 105 to 110.
    assert mean == pytest.approx((8 * 10 + 8 * 15) / 20)
    assert peak == 16
    assert drops == {"policy:stale": 3}
    assert agentic.lease_occupancy(None, 0, 1) == (None, None, {})


def _run(
    system: str, accs: list[tuple[float, float]], train_s: float, seed: int = 0, **extra
) -> object:
    res = _results.PolicyResult("policy", steps=4, trained_samples=512, train_s=train_s,
                                samples_per_s=512 / train_s, idle_fraction=0.5, extra=extra)  # fmt: skip
    res.evals = [_records.EvalPoint(i, t, a) for i, (t, a) in enumerate(accs)]
    run = _results.RunResult(system, seed, True, train_s + 10, startup_s=5.0, t0=0.0)
    run.policies["policy"] = res
    return run


def test_analysis_report_and_plot(agentic, tmp_path):
    settings = {
        "group_size": 8, "groups_per_step": 16, "max_turns": 3,
        "env_latency": {"distribution": "lognormal", "p50_s": 0.3, "p99_s": 5.0},
    }  # fmt: skip
    runs = [
        _run(
            "trl",
            [(0, 0.20), (40, 0.22), (80, 0.25)],
            80.0,
            active_per_turn=[[128, 100, 90]],
            env_wait_s_per_step=15.0,
            generate_s_per_step=18.0,
            episodes_in_flight_mean=80,
            episodes_in_flight_max=128,
        ),  # fmt: skip
        _run("astraflow_sync", [(0, 0.20), (30, 0.24), (60, 0.26)], 60.0),
        _run(
            "astraflow_async",
            [(0, 0.20), (5, 0.23), (10, 0.27)],
            10.0,
            episodes_in_flight_mean=300,
            episodes_in_flight_max=512,
        ),  # fmt: skip
    ]
    # a second seed: pairs give intervals; its TRL run never reaches the target
    runs += [
        _run("trl", [(0, 0.20), (50, 0.21), (100, 0.22)], 100.0, seed=1),
        _run("astraflow_sync", [(0, 0.20), (40, 0.23), (80, 0.25)], 80.0, seed=1),
        _run("astraflow_async", [(0, 0.20), (8, 0.24), (16, 0.24)], 16.0, seed=1),
    ]
    summary = agentic.analyse(runs, settings)
    assert summary["accuracy_before"] == 0.20 and summary["target_acc"] == 0.23  # start + 0.03
    # censored medians: TRL's (80, never) -> never; sync (30, 40) -> 35; async (5, 8) -> 6.5
    assert summary["speedup_vs_trl"] is None
    assert summary["speedup_async_over_sync"] == pytest.approx(35 / 6.5)
    pairs = summary["speedup_async_over_sync_paired"]
    assert pairs["reached"] == 2 and pairs["geo_mean"] == pytest.approx((6 * 5) ** 0.5)
    lo, hi = pairs["ci95"]
    assert lo < pairs["geo_mean"] < hi
    vs_trl = summary["speedup_vs_trl_paired"]
    assert vs_trl["reached"] == 1 and vs_trl["only_system"] == 1 and vs_trl["ci95"] is None
    # final accuracy, async - sync, per seed: +0.01 and -0.01
    assert summary["final_acc_gap_async_vs_sync"] == pytest.approx(0.0)
    lo, hi = summary["final_acc_gap_async_vs_sync_ci95"]
    assert lo < 0 < hi
    assert summary["ladder"][0] == "0.20" and summary["ladder"][-1] == "0.40"  # fixed
    assert summary["systems"]["astraflow_async"]["time_to_acc"]["0.23"] == 6.5
    assert summary["systems"]["trl"]["time_to_acc"]["0.26"] is None
    assert summary["systems"]["trl"]["time_to_target_reached"] == 1
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


def test_sandbox_runs_are_read_from_a_real_store_without_sql(agentic, tmp_path):
    """A real service stores the node's episode info; the bench reads each training episode's
    sandbox duration and returns back through the dataflow's storage functions."""
    sys.path.insert(0, str(BENCH.parent / "tests" / "dataflow"))
    from dataflow_helpers import TOKEN, ThreadedService, group, make_recipe

    from astraflow.protocol.client import SyncDataflowClient

    db = tmp_path / "df.db"
    with (
        ThreadedService(make_recipe(tmp_path), db) as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=0) as client,
    ):
        node = client.register(policies={"policy": 0}, name="n").node_id
        (lease,) = client.lease(node_id=node, max_tasks=1, versions={"policy": 0}).leases
        episodes = group(lease.task.id, [0.0, 1.0, 1.0, 0.0])
        for i, ep in enumerate(episodes):
            ep.info = {"sandbox": {"duration_s": 0.5 + i}}  # the env's info, as a node sends it
        client.push(node_id=node, lease_id=lease.id, episodes=episodes)
    durations, returns = agentic.episode_sandbox_runs(db)
    assert sorted(durations) == [0.5, 1.5, 2.5, 3.5]
    assert sorted(returns) == [0.0, 0.0, 1.0, 1.0]
    assert agentic.episode_sandbox_runs(tmp_path / "missing.db") == ([], [])
