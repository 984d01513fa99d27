"""The multi-policy agentic benchmark's analysis (``bench/multi_policy_agentic.py``) on
synthetic runs: the targets (the lock-step runs' median final accuracy of each policy), the race
decided by the slower policy, the paired figures, the straggler bound, the report and the plot. No
training run (the benchmark itself is not a timed test)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
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
        _run("astraflow_sync", 0, {"solver": [(0, 0.2), (30, 0.22), (60, 0.26), (90, 0.26)],
                                   "verifier": [(0, 0.1), (30, 0.3), (60, 0.5), (90, 0.6)]}, 90),
        _run("astraflow_async", 0, {"solver": [(0, 0.2), (20, 0.27), (40, 0.25), (60, 0.28)],
                                    "verifier": [(0, 0.1), (20, 0.4), (40, 0.61), (60, 0.7)]}, 60),
        _run("astraflow_sync", 1, {"solver": [(0, 0.2), (50, 0.25), (100, 0.24)],
                                   "verifier": [(0, 0.1), (50, 0.5), (100, 0.5)]}, 100),
        _run("astraflow_async", 1, {"solver": [(0, 0.2), (10, 0.25)],
                                    "verifier": [(0, 0.1), (10, 0.45)]}, 10),
        _run("astraflow_sync", 2, {"solver": [(0, 0.2), (40, 0.25)],
                                   "verifier": [(0, 0.1), (40, 0.55)]}, 40),
        _run("astraflow_async", 2, {"solver": [(0, 0.2), (15, 0.24), (30, 0.26)],
                                    "verifier": [(0, 0.1), (15, 0.56)]}, 30),
    ]  # fmt: skip
    summary = bench.analyse(runs, settings)
    # one level per policy for both systems and every seed: the lock-step finals' median
    assert summary["targets"] == {"solver": 0.25, "verifier": 0.55}
    assert summary["targets_per_seed"]["1"] == {"solver": 0.24, "verifier": 0.5}
    sync, fast = summary["systems"]["astraflow_sync"], summary["systems"]["astraflow_async"]
    # solver: sync 60, 50, 40 s; async 20, 10, 30 s. verifier: sync 90, never (seed 1 ends at
    # 0.5), 40 s; async 40, never, 15 s. A seed that never reaches the level ranks last.
    assert sync["solver"]["time_to_lockstep_final_acc_s"]["median"] == pytest.approx(50.0)
    assert fast["solver"]["time_to_lockstep_final_acc_s"]["median"] == pytest.approx(20.0)
    assert sync["verifier"]["time_to_lockstep_final_acc_s"]["median"] == pytest.approx(90.0)
    assert fast["verifier"]["time_to_lockstep_final_acc_s"]["median"] == pytest.approx(40.0)
    assert summary["speedup_time_to_acc_by_policy"] == pytest.approx(
        {"solver": 2.5, "verifier": 2.25}
    )
    assert summary["speedup_time_to_acc"] == pytest.approx(2.25)  # the slower policy's
    # both policies per seed: sync 90, never, 40; async 40, never, 30 -> paired over seeds 0, 2
    assert sync["time_to_acc_s"]["median"] == pytest.approx(90.0)
    paired = summary["speedup_time_to_acc_paired"]
    assert paired["reached"] == 2 and paired["geo_mean"] == pytest.approx(
        (90 / 40 * 40 / 30) ** 0.5
    )
    # each seed's own lock-step final: sync reaches it in every seed (90, 50, 40 s); async at 40,
    # never (its verifier ends at 0.45 < 0.5), 30 s
    own = summary["speedup_time_to_own_seed_target"]
    assert own["ratio"] == pytest.approx(50 / 40)
    gap = summary["final_acc_gap_async_minus_sync"]["verifier"]
    assert gap["mean"] == pytest.approx((0.1 - 0.05 + 0.01) / 3) and gap["n"] == 3
    assert fast["solver"]["final_acc"]["median"] == pytest.approx(0.26)
    # the straggler bound: 128-episode rounds, 3 solver tries + the verifier's check in series
    bound = summary["straggler"]
    assert bound["batch"] == 128 and bound["tool_calls_per_episode_max"] == 4
    assert bound["lockstep_wait_per_step_s"] == pytest.approx(4 * bound["expected_max_s"])
    assert bound["expected_max_s"] > 5 * bound["mean_s"]
    bench.print_report(summary, runs)
    json.dumps(summary)  # the --json payload is plain data
    import results

    md = "\n".join(results.render_multi_policy_agentic(summary))
    assert "| **astraflow_async** / verifier |" in md and "| 2.25x |" in md
    assert "solver 0.250, verifier 0.550" in md  # the levels raced to
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
    assert summary["targets"] == {"solver": 0.25, "verifier": None}
    assert summary["speedup_time_to_acc"] == pytest.approx(3.0)
    fast = summary["systems"]["astraflow_async"]
    assert fast["verifier"]["time_to_lockstep_final_acc_s"]["n"] == 0
    # the final-accuracy gap pairs every seed, raced or not
    gap = summary["final_acc_gap_async_minus_sync"]["verifier"]
    assert gap["n"] == 1 and gap["mean"] == pytest.approx(0.01)
    assert "verifier" not in summary["speedup_time_to_acc_by_policy_paired"]
