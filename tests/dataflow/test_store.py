"""The SQLite group-commit store: isolation between operations, durability across reopen."""

from __future__ import annotations

import asyncio
import sqlite3
import threading

import pytest

from astraflow.dataflow.store import Store


def test_failing_operation_rolls_back_alone(tmp_path):
    store = Store(tmp_path / "s.db")
    gate = threading.Event()

    def blocker(tx):
        gate.wait(5)

    def good(i):
        return lambda tx: tx.set_meta(f"k{i}", str(i))

    def bad(tx):
        tx.set_meta("bad", "1")
        raise ValueError("boom")

    first = store.submit(blocker)  # holds the writer so the next ops commit as one group
    futures = [store.submit(good(0)), store.submit(bad), store.submit(good(1))]
    gate.set()
    first.result()
    assert futures[0].result() is None and futures[2].result() is None
    with pytest.raises(ValueError, match="boom"):
        futures[1].result()
    assert store.commits <= 3  # the three queued ops shared a commit
    store.close()
    conn = sqlite3.connect(tmp_path / "s.db")
    keys = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    assert keys == {"k0": "0", "k1": "1"}


def test_wal_mode_and_async_run(tmp_path):
    store = Store(tmp_path / "s.db")

    async def main():
        results = await asyncio.gather(
            *[store.run(lambda tx, i=i: tx.set_meta(f"x{i}", str(i)) or i) for i in range(50)]
        )
        return results

    assert asyncio.run(main()) == list(range(50))
    assert store.call(lambda tx: tx.scalar("PRAGMA journal_mode")) == "wal"
    assert store.call(lambda tx: tx.scalar("SELECT COUNT(*) FROM meta")) == 50
    store.close()
    reopened = Store(tmp_path / "s.db")
    assert reopened.call(lambda tx: tx.get_meta("x49")) == "49"
    reopened.close()


def test_metrics_lines_missing_after_a_crash_are_recovered(tmp_path):
    import json

    from astraflow.dataflow.metrics import MetricsLog

    path = tmp_path / "metrics.jsonl"
    store = Store(tmp_path / "s.db")
    log = MetricsLog(path)
    for step in (1, 2, 3):
        store.call(lambda tx, step=step: log.record(tx, {"type": "step", "step": step}))
    lines = path.read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3]
    path.write_text(lines[0] + "\n")  # the process died after the commit, before the appends
    recovered = MetricsLog(path)
    assert store.call(recovered.recover) == 2
    assert store.call(recovered.recover) == 0
    assert [json.loads(x)["seq"] for x in path.read_text().splitlines()] == [1, 2, 3]
    store.close()
