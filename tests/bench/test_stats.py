"""The bench statistics (``bench/_stats.py``) on constructed data: censoring counted both ways,
the sustained time-to-target, the target ladder, accuracy at equal wall clock and the
non-inferiority verdict."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import _stats  # noqa: E402


def test_paired_speedup_counts_a_seed_only_the_baseline_reached():
    # seed 0: both (2x), seed 1: only the system, seed 2: only the baseline, seed 3: neither
    out = _stats.paired_speedup([100.0, None, 50.0, None], [50.0, 30.0, None, None])
    assert out["reached"] == 1 and out["geo_mean"] == pytest.approx(2.0)
    assert out["only_system"] == 1
    assert out["only_baseline"] == 1  # a loss the ratio cannot state is not dropped
    assert out["neither"] == 1
    assert out["seeds"] == 4


def test_paired_speedup_one_sided_censoring_against_the_system_is_never_silent():
    # every seed the system failed while the baseline got there: no ratio, but 3 losses
    out = _stats.paired_speedup([10.0, 20.0, 30.0], [None, None, None])
    assert out["geo_mean"] is None and out["reached"] == 0
    assert (out["only_baseline"], out["only_system"], out["seeds"]) == (3, 0, 3)


def test_paired_speedup_is_symmetric_in_its_censoring_counts():
    base, system = [10.0, None, 40.0, 8.0], [5.0, 9.0, None, 4.0]
    a, b = _stats.paired_speedup(base, system), _stats.paired_speedup(system, base)
    assert (a["only_system"], a["only_baseline"]) == (b["only_baseline"], b["only_system"])
    assert a["geo_mean"] == pytest.approx(1 / b["geo_mean"])


def test_sustained_needs_two_consecutive_evaluations_whose_mean_reaches_the_target():
    curve = [(0, 0.25), (10, 0.30), (20, 0.24), (30, 0.29), (40, 0.29)]
    # first crossing at t=10 (one lucky evaluation); the mean of (0.30, 0.24) = 0.27 misses
    assert _stats.time_to_sustained(curve, 0.28, window=1) == 10
    assert _stats.time_to_sustained(curve, 0.28) == 40  # (0.29 + 0.29) / 2, known at t=40
    assert _stats.time_to_sustained(curve, 0.295) is None
    # (0.30 + 0.29) / 2 = 0.295 >= 0.29 at the second of the two evaluations
    assert _stats.time_to_sustained([(0, 0.30), (5, 0.29)], 0.29) == 5
    assert _stats.time_to_sustained([(0, 0.9)], 0.5) is None  # one evaluation cannot sustain


def test_sustained_reads_eval_points_and_sorts_by_time():
    class P:
        def __init__(self, t, accuracy):
            self.t, self.accuracy = t, accuracy

    pts = [P(20, 0.5), P(0, 0.1), P(10, 0.5)]
    assert _stats.time_to_sustained(pts, 0.5) == 20


def test_accuracy_at_a_budget_is_the_last_evaluation_before_it():
    curve = [(0, 0.2), (10, 0.3), (20, 0.4)]
    assert _stats.accuracy_at(curve, 15) == 0.3
    assert _stats.accuracy_at(curve, 20) == 0.4
    assert _stats.accuracy_at(curve, 1000) == 0.4  # finished earlier: keeps its final accuracy
    assert _stats.accuracy_at(curve[1:], 5) is None


def test_target_ladder_reports_every_level_with_both_censorings():
    fast = [[(0, 0.2), (1, 0.3), (2, 0.3)], [(0, 0.2), (1, 0.21), (2, 0.22)]]
    slow = [[(0, 0.2), (10, 0.3), (20, 0.3)], [(0, 0.2), (10, 0.3), (20, 0.3)]]
    out = _stats.target_ladder(
        {"base": slow, "sys": fast},
        {"start+0.05": 0.25, "base median final": 0.3, "high": 0.5, "low": 0.21},
        [("base", "sys")],
    )
    assert list(out) == ["low", "start+0.05", "base median final", "high"]  # by level
    row = out["base median final"]
    assert row["systems"]["sys"]["reached"] == 1 and row["systems"]["base"]["reached"] == 2
    pair = row["sys_vs_base"]
    assert pair["reached"] == 1 and pair["geo_mean"] == pytest.approx(10.0)
    assert pair["only_baseline"] == 1 and pair["only_system"] == 0
    assert out["high"]["systems"]["sys"]["time_s"] is None
    assert out["high"]["sys_vs_base"]["neither"] == 2


def test_accuracy_at_equal_wallclock_pairs_seeds():
    fast = [[(0, 0.2), (1, 0.25), (2, 0.3)], [(0, 0.2), (1, 0.3), (2, 0.32)]]
    slow = [[(0, 0.2), (10, 0.3), (20, 0.35)], [(0, 0.2), (10, 0.28), (20, 0.36)]]
    out = _stats.acc_at_equal_wallclock(
        {"base": slow, "sys": fast}, {"short": 2.0, "long": 20.0}, [("base", "sys")]
    )
    assert out["short"]["systems"]["sys"]["median"] == pytest.approx(0.31)
    assert out["short"]["systems"]["base"]["median"] == pytest.approx(0.2)
    assert out["short"]["sys_minus_base"]["mean"] == pytest.approx(0.11)
    assert out["long"]["sys_minus_base"]["mean"] == pytest.approx(-0.045)
    assert out["short"]["finished_by_budget"] == {"base": 0, "sys": 2}


@pytest.mark.parametrize(
    ("diffs", "verdict"),
    [
        ([0.01, 0.0, 0.005, -0.005], "non-inferior"),
        ([-0.05, -0.06, -0.055, -0.045], "inferior"),
        ([0.02, -0.06, 0.01, -0.05], "inconclusive"),
        ([0.01], "inconclusive"),  # no interval from one pair
    ],
)
def test_non_inferiority_against_a_declared_margin(diffs, verdict):
    out = _stats.non_inferiority(diffs, margin=0.02)
    assert out["verdict"] == verdict and out["margin"] == 0.02
    assert out["n"] == len(diffs)
    if out["ci95"] is not None:
        assert math.isclose(out["mean"], sum(diffs) / len(diffs))
