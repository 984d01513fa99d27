"""The chaos benchmark's short version (``bench/chaos.py``): one real quickstart run while a
seeded schedule SIGKILLs and SIGSTOPs its services; every invariant holds afterwards."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def chaos():
    sys.path.insert(0, str(BENCH))
    try:
        import chaos as module

        yield module
    finally:
        sys.path.remove(str(BENCH))


def test_schedule_is_seeded_and_lands_during_training(chaos):
    import random

    a = chaos.schedule(random.Random(7), 6, 12)
    assert a == chaos.schedule(random.Random(7), 6, 12)
    assert all(1 <= f.at_step <= 11 for f in a)
    assert [f.at_step for f in a] == sorted(f.at_step for f in a)


@pytest.mark.nightly  # a 12-step run under faults (bench/chaos.py); restarts are in the slow tier's shared runs
def test_a_run_under_faults_keeps_every_invariant(chaos, tmp_path):
    # seed 3: kills the trainer, a node and the dataflow at different steps
    outcome = chaos.run_once(tmp_path, seed=3, max_steps=12, faults=3)
    assert [f.kind for f in outcome.faults].count("kill") >= 2
    assert outcome.returncode == 0, outcome.violations
    assert outcome.violations == []
    assert outcome.steps_final == 12
    assert outcome.restarts >= 1  # a kill after the last step restarts nothing
    # and the checker does see a broken run: a step trained twice, an evaluation made up
    run_dir = tmp_path / "seed3" / "quickstart"
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    step = next(line for line in lines if '"type": "step"' in line)
    fake_eval = '{"type": "eval", "policy": "policy", "version": 5, "time": 0}'
    (run_dir / "metrics.jsonl").write_text("\n".join([*lines, step, fake_eval]) + "\n")
    _, violations = chaos.check_invariants(run_dir, 12)
    assert any("step records" in v for v in violations)
    assert any("discarded timeline" in v for v in violations)
