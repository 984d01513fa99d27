"""The SQLite group-commit store: isolation between operations, durability across reopen."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading

import pytest

from astraflow.dataflow.storage.store import Store


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

    from astraflow.dataflow.ops.metrics import MetricsLog

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


def _on_wal_fsync(monkeypatch, store_path, action) -> None:
    """Run ``action()`` before every fsync of the store's WAL file (it may block or raise)."""
    from astraflow.dataflow.storage import store as store_mod

    wal_ino = os.stat(f"{store_path}-wal").st_ino
    real_fsync = os.fsync

    def fsync(fd):
        if os.fstat(fd).st_ino == wal_ino:
            action()
        return real_fsync(fd)

    monkeypatch.setattr(store_mod.os, "fsync", fsync)


def test_full_replies_wait_for_the_wal_flush_while_the_writer_goes_on(tmp_path, monkeypatch):
    """synchronous=FULL: the writer commits without flushing; the reply waits for the flusher's
    fsync of the WAL, and the writer commits the next groups meanwhile."""
    path = tmp_path / "s.db"
    store = Store(path)
    release, entered = threading.Event(), threading.Event()
    _on_wal_fsync(monkeypatch, path, lambda: (entered.set(), release.wait(10)))
    first = store.submit(lambda tx: tx.set_meta("a", "1"))
    assert entered.wait(5)  # the flusher is inside fsync for the first group
    second = store.submit(lambda tx: tx.set_meta("b", "2"))
    reader = sqlite3.connect(path)
    for _ in range(500):  # the writer commits the second group while the flush is held
        if reader.execute("SELECT COUNT(*) FROM meta WHERE key IN ('a','b')").fetchone()[0] == 2:
            break
        threading.Event().wait(0.01)
    assert reader.execute("SELECT COUNT(*) FROM meta WHERE key IN ('a','b')").fetchone()[0] == 2
    assert not first.done() and not second.done()  # committed, not yet acknowledged
    release.set()
    assert first.result(5) is None and second.result(5) is None
    assert store.flushes >= 1
    reader.close()
    store.close()


def test_a_failed_wal_flush_fails_its_replies_and_closes_the_store(tmp_path, monkeypatch):
    from astraflow.dataflow.storage.store import StoreClosed

    path = tmp_path / "s.db"
    store = Store(path)

    def fail():
        raise OSError(5, "Input/output error")

    _on_wal_fsync(monkeypatch, path, fail)
    with pytest.raises(OSError, match="Input/output error"):
        store.call(lambda tx: tx.set_meta("a", "1"))
    with pytest.raises(StoreClosed, match="failed to flush"):
        store.call(lambda tx: tx.set_meta("b", "2"))
    monkeypatch.undo()
    store.close()
    assert not store._thread.is_alive()


def test_normal_mode_has_no_flusher(tmp_path):
    store = Store(tmp_path / "s.db", synchronous="NORMAL")
    store.call(lambda tx: tx.set_meta("a", "1"))
    assert store.flushes == 0
    assert store.call(lambda tx: tx.scalar("PRAGMA synchronous")) == 1  # NORMAL
    store.close()


def test_a_store_from_before_leases_carried_is_eval_is_migrated(tmp_path):
    """Stores written before ``leases.is_eval`` existed open with the column added and filled in
    from the tasks, so backpressure keeps counting only training leases after an upgrade."""
    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    old.executescript(
        "CREATE TABLE tasks (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, "
        "body BLOB NOT NULL, task_set TEXT NOT NULL, priority REAL NOT NULL DEFAULT 0, "
        "deadline REAL, group_size INTEGER NOT NULL, is_eval INTEGER NOT NULL DEFAULT 0, "
        "eval_id TEXT, eval_policy TEXT, min_version INTEGER, round INTEGER, "
        "state TEXT NOT NULL DEFAULT 'pending', winner TEXT, created_at REAL NOT NULL, "
        "done_at REAL);"
        "CREATE TABLE leases (id TEXT PRIMARY KEY, task_id TEXT NOT NULL, node_id TEXT NOT NULL, "
        "issued_at REAL NOT NULL, deadline REAL NOT NULL, state TEXT NOT NULL, "
        "versions TEXT NOT NULL, episodes INTEGER NOT NULL DEFAULT 0);"
        "INSERT INTO tasks(id, body, task_set, group_size, is_eval, state, created_at) "
        "VALUES ('t-train', x'', 'arith', 2, 0, 'leased', 0), "
        "('t-eval', x'', 'arith', 1, 1, 'leased', 0);"
        "INSERT INTO leases(id, task_id, node_id, issued_at, deadline, state, versions) "
        "VALUES ('l-train', 't-train', 'n', 0, 9, 'active', '{}'), "
        "('l-eval', 't-eval', 'n', 0, 9, 'active', '{}');"
    )
    old.commit()
    old.close()
    from astraflow.dataflow import storage

    store = Store(path)
    rows = store.call(
        lambda tx: tx.execute("SELECT id, is_eval FROM leases ORDER BY id").fetchall()
    )
    assert rows == [("l-eval", 1), ("l-train", 0)]
    assert store.call(storage.leases.in_flight_training) == 1
    store.close()
    Store(path).close()  # a second open finds the column and leaves it be


def test_a_store_from_before_per_turn_rewards_is_migrated(tmp_path):
    """Samples stored before ``samples.turn_rewards`` existed open with the column added (NULL:
    no per-turn rewards kept), and new samples can carry them."""
    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    old.executescript(
        "CREATE TABLE samples (id TEXT PRIMARY KEY, episode_id TEXT NOT NULL, lease_id TEXT NOT "
        "NULL, task_id TEXT NOT NULL, policy TEXT NOT NULL, role TEXT NOT NULL, group_id TEXT, "
        "reward REAL NOT NULL, min_version INTEGER NOT NULL, max_version INTEGER NOT NULL, "
        "n_tokens INTEGER NOT NULL, tokens BLOB NOT NULL, loss_mask BLOB NOT NULL, "
        "logprobs BLOB NOT NULL, versions BLOB NOT NULL);"
        "INSERT INTO samples VALUES ('s-old', 'e', 'l', 't', 'p', 'agent', 'g', 1.0, 0, 0, 1, "
        "x'', x'', x'', x'');"
    )
    old.commit()
    old.close()
    from astraflow.dataflow import storage

    store = Store(path)
    store.call(
        lambda tx: storage.samples.insert(
            tx,
            [
                (
                    "s-new",
                    "e",
                    "l",
                    "t",
                    "p",
                    "g",
                    "agent",
                    1.0,
                    0,
                    0,
                    1,
                    b"",
                    b"",
                    b"",
                    b"",
                    "[0.5, 0.5]",
                )
            ],  # fmt: skip
        )
    )
    rows = store.call(lambda tx: storage.samples.for_assembly(tx, ["s-old", "s-new"]))
    assert rows["s-old"].turn_rewards is None and rows["s-new"].turn_rewards == "[0.5, 0.5]"
    store.close()
    Store(path).close()


def test_history_reads_a_run_as_its_clients_saw_it(tmp_path):
    """``storage.history``: what tests and tools read from a store (no SQL of their own) agrees
    with what the service told its clients, read live and from the closed file."""
    from dataflow_helpers import TOKEN, ThreadedService, group, make_recipe

    from astraflow.dataflow.storage import history, store
    from astraflow.protocol.client import SyncDataflowClient

    db = tmp_path / "df.db"
    with ThreadedService(make_recipe(tmp_path), db) as svc:
        with SyncDataflowClient(svc.url, TOKEN, retries=0) as c:
            node = c.register(policies={"policy": 0}, name="n").node_id
            leases = c.lease(node_id=node, max_tasks=2, versions={"policy": 0}).leases
            for lease in leases:
                c.push(node_id=node, lease_id=lease.id, episodes=group(lease.task.id, [0, 1, 1, 0]))
            batch = c.next_batch(policy="policy", num_groups=2, trainer_version=0).batch
            c.ack(batch.id, trainer_version=1)
            c.announce_version(policy="policy", version=1, location="mem://1", digest="d1")
            live = svc.service.store.call(history.leases)
    with store.read_only(db) as tx:
        tasks, episodes = history.tasks(tx), history.episodes(tx)
        samples, batches, versions = history.samples(tx), history.batches(tx), history.versions(tx)
    assert [(x.id, x.node_id, x.state) for x in live] == [(x.id, node, "finished") for x in leases]
    done = {t.id: t for t in tasks if t.state == "done"}
    assert {x.task.id for x in leases} == set(done)
    assert {done[x.task.id].winner for x in leases} == {x.id for x in leases}
    assert len(episodes) == 8 and {e.lease_id for e in episodes} == {x.id for x in leases}
    assert sorted(e.rewards["agent"] for e in episodes) == [0, 0, 0, 0, 1, 1, 1, 1]
    [acked] = [b for b in batches if b.state == "acked"]
    assert (acked.id, acked.step) == (batch.id, 1)
    assert sorted(acked.sample_ids) == sorted(s.id for s in batch.samples)
    assert {s.batch_id for s in samples} == {batch.id} and len(samples) == 8
    assert [(v.policy, v.version, v.digest) for v in versions][-1] == ("policy", 1, "d1")


def test_the_wal_stays_bounded_under_a_steady_stream_of_commits(tmp_path):
    """Passive checkpoints never catch up with a writer that always has the next group: SQLite
    then never starts the WAL over and it grows without bound. Past its limit the writer
    checkpoints it whole and truncates it, and every committed row is in the database."""
    store = Store(tmp_path / "s.db", checkpoint_s=3600.0, wal_limit_bytes=256 * 1024)
    blob = "x" * 8000
    for i in range(300):  # about 2.4 MB of rows
        store.call(lambda tx, i=i: tx.set_meta(f"k{i}", blob))
    wal = (tmp_path / "s.db-wal").stat().st_size
    assert wal < 1024 * 1024, wal
    assert store.wal_resets >= 1
    assert store.call(lambda tx: tx.get_meta("k0")) == blob
    store.close()


def test_the_shutdown_audit_finds_a_leases_episodes_by_index(tmp_path):
    """The audit counts each done task's episodes by lease (``storage/audit.py``); without an index
    on ``episodes(lease_id)`` that is a scan per task, minutes on a quickstart-sized store, and
    the launcher SIGKILLed the dataflow service before ``run_summary`` was written."""
    store = Store(tmp_path / "s.db")
    plan = store.call(
        lambda tx: [
            str(tuple(row))
            for row in tx.execute(
                "EXPLAIN QUERY PLAN SELECT COUNT(*) FROM episodes e WHERE e.lease_id = ?", ("l",)
            ).fetchall()
        ]
    )
    store.close()
    assert any("episodes_by_lease" in row for row in plan), plan
