"""The multi-policy agentic benchmark's analysis (``tests/bench/multi_policy_agentic.py``) on
synthetic runs: the per-seed targets (the lock-step run's final accuracy of each policy), the race
decided by the slower policy, the paired figures, the straggler bound, the report and the plot. No
training run (the benchmark itself is not a timed test)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import _records  # noqa: E402
import _results  # noqa: E402


@pytest.fixture(scope="module")
def bench():
    import multi_policy_agentic as module

    return module


def _run(system: str, seed: int, curves: dict[str, list[tuple[float, float]]], train_s: float):
    run = _results.RunResult(system, seed, True, train_s + 30, startup_s=20.0, t0=0.0)
    for policy, points in curves.items():
        res = _results.PolicyResult(
            policy, steps=len(points) - 1, trained_samples=64 * (len(points) - 1),
            train_s=train_s, samples_per_s=64 * (len(points) - 1) / train_s, idle_fraction=0.4,
            extra={"episodes_in_flight_mean": 100.0, "episodes_in_flight_max": 256},
        )  # fmt: skip
        res.evals = [_records.EvalPoint(2 * i, t, a) for i, (t, a) in enumerate(points)]
        run.policies[policy] = res
    return run


def test_analysis_races_to_the_lockstep_final_accuracy(bench, tmp_path):
    settings = bench.recipe_settings()
    runs = [
        # seed 0: sync ends at solver 0.26, verifier 0.60; async reaches 0.26 at 20 s and 0.60
        # at 40 s -> both at 40 s; sync's first evaluation at those levels: 60 s (solver) and
        # 90 s (verifier) -> both at 90 s
        _run("astraflow_sync", 0, {"solver": [(0, 0.2), (30, 0.22), (60, 0.26), (90, 0.26)],
                                   "verifier": [(0, 0.1), (30, 0.3), (60, 0.5), (90, 0.6)]}, 90),
        _run("astraflow_async", 0, {"solver": [(0, 0.2), (20, 0.27), (40, 0.25), (60, 0.28)],
                                    "verifier": [(0, 0.1), (20, 0.4), (40, 0.61), (60, 0.7)]}, 60),
        # seed 1: async never reaches the verifier's target
        _run("astraflow_sync", 1, {"solver": [(0, 0.2), (50, 0.24)],
                                   "verifier": [(0, 0.1), (50, 0.5)]}, 50),
        _run("astraflow_async", 1, {"solver": [(0, 0.2), (10, 0.25)],
                                    "verifier": [(0, 0.1), (10, 0.45)]}, 10),
    ]  # fmt: skip
    summary = bench.analyse(runs, settings)
    assert summary["targets"] == {"0": {"solver": 0.26, "verifier": 0.6},
                                  "1": {"solver": 0.24, "verifier": 0.5}}  # fmt: skip
    sync, fast = summary["systems"]["astraflow_sync"], summary["systems"]["astraflow_async"]
    assert sync["solver"]["time_to_lockstep_final_acc_s"]["median"] == pytest.approx(55.0)
    assert fast["solver"]["time_to_lockstep_final_acc_s"]["median"] == pytest.approx(15.0)
    # both policies: sync (90, 50) -> 70; async (40, never) -> never: no headline ratio
    assert sync["time_to_acc_s"]["median"] == pytest.approx(70.0)
    assert fast["time_to_acc_s"]["median"] is None
    assert summary["speedup_time_to_acc"] is None
    paired = summary["speedup_time_to_acc_paired"]
    assert paired["reached"] == 1 and paired["geo_mean"] == pytest.approx(90 / 40)
    assert summary["speedup_time_to_acc_by_policy"]["solver"] == pytest.approx(55 / 15)
    gap = summary["final_acc_gap_async_minus_sync"]["verifier"]
    assert gap["mean"] == pytest.approx((0.1 - 0.05) / 2) and gap["n"] == 2
    assert fast["solver"]["final_acc"]["median"] == pytest.approx((0.28 + 0.25) / 2)
    # the straggler bound: 128-episode rounds, 3 solver tries + the verifier's check in series
    bound = summary["straggler"]
    assert bound["batch"] == 128 and bound["tool_calls_per_episode_max"] == 4
    assert bound["lockstep_wait_per_step_s"] == pytest.approx(4 * bound["expected_max_s"])
    assert bound["expected_max_s"] > 5 * bound["mean_s"]
    bench.print_report(summary, runs)
    json.dumps(summary)  # the --json payload is plain data
    import results

    md = "\n".join(results.render_multi_policy_agentic(summary))
    assert "| **astraflow_async** / verifier |" in md and "| 2.25 [" in md  # seed 0: 90 / 40
    png = bench.plot(runs, tmp_path / "mpa.png")
    assert png is not None and png.stat().st_size > 0


def test_time_to_both_is_the_slower_policy(bench):
    assert bench.both_reached({"solver": 10.0, "verifier": 30.0}) == 30.0
    assert bench.both_reached({"solver": 10.0, "verifier": None}) is None
    assert bench.both_reached({}) is None


def test_a_policy_lock_step_did_not_improve_is_not_raced(bench):
    """Lock-step's verifier ends below its start: every run would "reach" that at t = 0, so the
    verifier has no target and the solver alone decides."""
    runs = [
        _run("astraflow_sync", 0, {"solver": [(0, 0.2), (30, 0.25)],
                                   "verifier": [(0, 0.1), (30, 0.08)]}, 30),
        _run("astraflow_async", 0, {"solver": [(0, 0.2), (10, 0.25)],
                                    "verifier": [(0, 0.1), (10, 0.09)]}, 10),
    ]  # fmt: skip
    summary = bench.analyse(runs, bench.recipe_settings())
    assert summary["targets"] == {"0": {"solver": 0.25, "verifier": None}}
    assert summary["speedup_time_to_acc"] == pytest.approx(3.0)
    fast = summary["systems"]["astraflow_async"]
    assert fast["verifier"]["time_to_lockstep_final_acc_s"]["n"] == 0
    # the final-accuracy gap pairs every seed, raced or not
    gap = summary["final_acc_gap_async_minus_sync"]["verifier"]
    assert gap["n"] == 1 and gap["mean"] == pytest.approx(0.01)
    assert summary["speedup_time_to_acc_by_policy_paired"]["verifier"]["reached"] == 0
