"""The autoscale benchmark's node-seconds (``bench/autoscale.py:measure``): a grown node is
paid for from the decision that started it (its boot), a drained node until it exits, and both
are clipped to the training window (first lease to last step). The benchmark itself is not a
timed test."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def autoscale():
    sys.path.insert(0, str(BENCH))
    try:
        import autoscale as module

        yield module
    finally:
        sys.path.remove(str(BENCH))


def _lines(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_node_seconds_count_a_grown_nodes_boot_and_a_drained_nodes_exit(autoscale, tmp_path):
    nodes = {
        "a": {"name": "node-0", "registered_at": 90.0, "last_heartbeat": 200.0},  # before t0
        "b": {"name": "node-1", "registered_at": 110.0, "last_heartbeat": 150.0},  # grown at 102
    }
    _lines(tmp_path / "metrics.jsonl", [
        *({"type": "step", "policy": "policy", "step": i, "time": 100.0 + 20 * i,
           "reward_mean": 0.5} for i in range(1, 6)),
        {"type": "run_summary", "first_lease_at": 100.0, "nodes": nodes},
    ])  # fmt: skip
    _lines(tmp_path / "autoscale.jsonl", [
        {"time": 102.0, "decision": "grow", "pool": 1, "target": 3, "reason": "r",
         "nodes": ["node-1", "node-2"]},
        {"time": 140.0, "decision": "shrink", "pool": 3, "target": 2, "reason": "r",
         "nodes": ["node-1"]},
        {"time": 155.0, "event": "left", "node": "node-1", "returncode": 0},
    ])  # fmt: skip
    m = autoscale.measure(tmp_path)
    # window 100..200: node-0 100 s; node-1 booted from 102, left at 155: 53 s; node-2 was
    # started at 102 and never registered: booting to the end, 98 s
    assert m["node_seconds"] == pytest.approx(100 + 53 + 98)
    assert m["registered_node_seconds"] == pytest.approx(100 + 40)
    assert m["nodes"] == 3 and m["train_s"] == 100.0
    assert [c["decision"] for c in m["changes"]] == ["grow", "shrink"]
