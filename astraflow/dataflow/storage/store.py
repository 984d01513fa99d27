"""The dataflow service's durable store: one SQLite file in WAL mode, written by one thread.

Why one writer thread: SQLite allows one writer at a time anyway, and funnelling every operation
through a single connection makes each operation a serialisable transaction without locks in
Python. Why group commit: an fsync per HTTP request caps throughput at the disk's fsync rate, so
the writer drains every operation already queued, runs each inside its own SAVEPOINT (one failure
rolls back only that operation), commits once, and only then resolves the callers' futures. A reply
is therefore never sent before the data it acknowledges is durable ("ack after commit").

Why the fsync is not on the writer thread (``synchronous="FULL"``, the default): a commit that
fsyncs the WAL itself keeps the one writer idle for the disk's flush time (5-8 ms a group, a third
of its time under load). The writer instead commits with SQLite's ``synchronous=NORMAL`` (frames
written to the WAL, no flush) and goes on with the next group while a second thread, the
*flusher*, fsyncs the WAL file and only then runs the groups' post-commit hooks and hands out
their replies, in commit order. An acknowledged operation is thus exactly as durable as under
SQLite's FULL: its WAL frames were flushed before its reply left. Data of a later group may read
data of an earlier one that is not flushed yet; its own reply waits for a flush that covers both.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from astraflow.errors import AstraFlowError

T = TypeVar("T")
R = TypeVar("R", bound=tuple)

#: The WAL size past which the writer checkpoints it whole and truncates it (:meth:`Store._bound_wal`).
WAL_LIMIT_BYTES = 64 * 2**20

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tasks (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    body BLOB NOT NULL,
    task_set TEXT NOT NULL,
    priority REAL NOT NULL DEFAULT 0,
    deadline REAL,
    group_size INTEGER NOT NULL,
    is_eval INTEGER NOT NULL DEFAULT 0,
    eval_id TEXT,
    eval_policy TEXT,
    min_version INTEGER,
    round INTEGER,
    state TEXT NOT NULL DEFAULT 'pending',
    winner TEXT,
    created_at REAL NOT NULL,
    done_at REAL
);
CREATE INDEX IF NOT EXISTS tasks_by_state ON tasks (state, is_eval, round);
CREATE TABLE IF NOT EXISTS leases (
    id TEXT PRIMARY KEY,
    task_id TEXT NOT NULL,
    node_id TEXT NOT NULL,
    issued_at REAL NOT NULL,
    deadline REAL NOT NULL,
    state TEXT NOT NULL,
    versions TEXT NOT NULL,
    episodes INTEGER NOT NULL DEFAULT 0,
    -- the task's is_eval, copied: backpressure counts active training leases on every lease
    -- request, which then reads one index instead of joining every active lease to its task
    is_eval INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS leases_by_state ON leases (state, deadline);
CREATE INDEX IF NOT EXISTS leases_by_node ON leases (node_id, state);
CREATE INDEX IF NOT EXISTS leases_by_task ON leases (task_id);
CREATE TABLE IF NOT EXISTS episodes (
    id TEXT PRIMARY KEY,
    task_id TEXT NOT NULL,
    lease_id TEXT NOT NULL,
    node_id TEXT NOT NULL,
    is_eval INTEGER NOT NULL,
    finish_reason TEXT NOT NULL,
    error TEXT,
    rewards TEXT NOT NULL,
    info TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS episodes_by_time ON episodes (created_at);
-- the shutdown audit and the run summary join episodes to their lease: without this index the
-- audit of a quickstart-sized store took minutes and the launcher SIGKILLed the service
CREATE INDEX IF NOT EXISTS episodes_by_lease ON episodes (lease_id);
CREATE INDEX IF NOT EXISTS episodes_failed ON episodes (finish_reason) WHERE error IS NOT NULL;
CREATE TABLE IF NOT EXISTS samples (
    id TEXT PRIMARY KEY,
    episode_id TEXT NOT NULL,
    lease_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    policy TEXT NOT NULL,
    role TEXT NOT NULL,
    group_id TEXT,
    reward REAL NOT NULL,
    min_version INTEGER NOT NULL,
    max_version INTEGER NOT NULL,
    n_tokens INTEGER NOT NULL,
    tokens BLOB NOT NULL,
    loss_mask BLOB NOT NULL,
    logprobs BLOB NOT NULL,
    versions BLOB NOT NULL,
    turn_rewards TEXT
);
CREATE INDEX IF NOT EXISTS samples_by_lease ON samples (lease_id);
CREATE INDEX IF NOT EXISTS samples_by_group ON samples (group_id);
CREATE TABLE IF NOT EXISTS groups (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    task_id TEXT NOT NULL,
    policy TEXT NOT NULL,
    task_set TEXT NOT NULL,
    round INTEGER,
    size INTEGER NOT NULL,
    reward_mean REAL NOT NULL,
    reward_std REAL NOT NULL,
    min_version INTEGER NOT NULL,
    priority REAL NOT NULL DEFAULT 0,
    deadline REAL,
    state TEXT NOT NULL,
    batch_id TEXT,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS groups_by_state ON groups (policy, state);
-- per-state counts (backpressure on every lease, /status) and a batch's groups (every ack) read
-- only the rows they need; without these both scanned every group of the run
CREATE INDEX IF NOT EXISTS groups_by_state_first ON groups (state, policy, size);
CREATE INDEX IF NOT EXISTS groups_by_batch ON groups (batch_id);
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    policy TEXT NOT NULL,
    trainer_id TEXT NOT NULL,
    trainer_version INTEGER NOT NULL,
    round INTEGER,
    layout TEXT NOT NULL,
    summary TEXT NOT NULL,
    state TEXT NOT NULL,
    served INTEGER NOT NULL DEFAULT 1,
    created_at REAL NOT NULL,
    acked_at REAL,
    step INTEGER
);
CREATE INDEX IF NOT EXISTS batches_by_state ON batches (policy, state);
CREATE INDEX IF NOT EXISTS batches_by_state_first ON batches (state, policy);
CREATE TABLE IF NOT EXISTS versions (
    policy TEXT NOT NULL,
    version INTEGER NOT NULL,
    body TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (policy, version)
);
CREATE TABLE IF NOT EXISTS nodes (
    id TEXT PRIMARY KEY,
    body TEXT NOT NULL,
    versions TEXT NOT NULL,
    state TEXT NOT NULL,
    registered_at REAL NOT NULL,
    last_heartbeat REAL NOT NULL,
    episodes INTEGER NOT NULL DEFAULT 0,
    metrics TEXT NOT NULL DEFAULT '{}'
);
-- registration counts the active nodes and /status lists them: with churn, nodes that left pile
-- up, and without it both scanned every node the run ever had
CREATE INDEX IF NOT EXISTS nodes_by_state ON nodes (state, registered_at);
CREATE TABLE IF NOT EXISTS drops (
    policy TEXT NOT NULL,
    reason TEXT NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (policy, reason)
);
CREATE TABLE IF NOT EXISTS staleness (
    policy TEXT NOT NULL,
    staleness INTEGER NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (policy, staleness)
);
CREATE TABLE IF NOT EXISTS idempotency (
    key TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    result BLOB NOT NULL,
    created_at REAL NOT NULL,
    digest TEXT NOT NULL DEFAULT ''
);
-- pruning expired keys reads only them (a scan of every key stalled the writer at scale)
CREATE INDEX IF NOT EXISTS idempotency_by_age ON idempotency (created_at);
CREATE TABLE IF NOT EXISTS feeder (
    task_set TEXT PRIMARY KEY,
    epoch INTEGER NOT NULL,
    position INTEGER NOT NULL,
    emitted INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS evaluations (
    id TEXT PRIMARY KEY,
    policy TEXT NOT NULL,
    version INTEGER NOT NULL,
    step INTEGER NOT NULL,
    task_set TEXT NOT NULL,
    split TEXT NOT NULL,
    num_tasks INTEGER NOT NULL,
    completed INTEGER NOT NULL DEFAULT 0,
    errors INTEGER NOT NULL DEFAULT 0,
    reward_sum REAL NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    finished_at REAL
);
CREATE TABLE IF NOT EXISTS policy_state (
    policy TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (policy, key)
);
CREATE TABLE IF NOT EXISTS replays (
    group_id TEXT PRIMARY KEY,
    source TEXT NOT NULL,
    origin TEXT NOT NULL,
    n INTEGER NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (
    policy TEXT NOT NULL,
    name TEXT NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (policy, name)
);
CREATE TABLE IF NOT EXISTS metric_records (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS transcripts (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    episode_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    step INTEGER NOT NULL,
    failed INTEGER NOT NULL,
    created_at REAL NOT NULL,
    body BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS transcripts_by_step ON transcripts (step, failed);
CREATE TABLE IF NOT EXISTS partials (
    task_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    lease_id TEXT NOT NULL,
    node_id TEXT NOT NULL,
    turns INTEGER NOT NULL,
    saved_at REAL NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (task_id, idx)
);
"""


def _migrate(conn: sqlite3.Connection) -> None:
    """Bring a store written by an earlier version up to :data:`SCHEMA` (columns that
    ``CREATE TABLE IF NOT EXISTS`` does not add), then create the indexes that use them."""
    lease_columns = {row[1] for row in conn.execute("PRAGMA table_info(leases)")}
    if "is_eval" not in lease_columns:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ALTER TABLE leases ADD COLUMN is_eval INTEGER NOT NULL DEFAULT 0")
        conn.execute(
            "UPDATE leases SET is_eval = 1 WHERE task_id IN (SELECT id FROM tasks WHERE is_eval=1)"
        )
        conn.execute("COMMIT")
    idem_columns = {row[1] for row in conn.execute("PRAGMA table_info(idempotency)")}
    if "digest" not in idem_columns:
        conn.execute("ALTER TABLE idempotency ADD COLUMN digest TEXT NOT NULL DEFAULT ''")
    sample_columns = {row[1] for row in conn.execute("PRAGMA table_info(samples)")}
    if "turn_rewards" not in sample_columns:  # per-turn rewards (JSON list), NULL: none kept
        conn.execute("ALTER TABLE samples ADD COLUMN turn_rewards TEXT")
    conn.execute("CREATE INDEX IF NOT EXISTS leases_in_flight ON leases (state, is_eval)")
    # a heartbeat reads each of its leases' latest save (storage.leases.progress_at)
    conn.execute("CREATE INDEX IF NOT EXISTS partials_by_lease ON partials (lease_id, saved_at)")


#: bound parameters per ``IN (...)`` list: well below SQLite's cap on a statement's parameters
IN_LIST_SIZE = 500


class Tx:
    """One operation's view of the open transaction: the connection plus post-commit hooks."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn
        self.after_commit: list[Callable[[], None]] = []

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        return self.conn.execute(sql, params)

    def executemany(self, sql: str, rows: Any) -> sqlite3.Cursor:
        return self.conn.executemany(sql, rows)

    def select_in(self, sql: str, values: list) -> list[tuple]:
        """Rows of ``sql`` whose ``{marks}`` is replaced by ``?, ?, ...`` for ``values``: one
        statement per :data:`IN_LIST_SIZE` values instead of one per value (the single writer
        runs every statement of every operation)."""
        rows: list[tuple] = []
        for i in range(0, len(values), IN_LIST_SIZE):
            chunk = values[i : i + IN_LIST_SIZE]
            marks = ",".join("?" * len(chunk))
            rows.extend(self.conn.execute(sql.format(marks=marks), chunk))
        return rows

    def one(self, sql: str, params: Any = ()) -> Any:
        return self.conn.execute(sql, params).fetchone()

    def rows(self, row_type: type[R], sql: str, params: Any = ()) -> list[R]:
        """Every row of ``sql`` as a ``row_type`` (a NamedTuple of the selected columns)."""
        make = row_type._make  # type: ignore[attr-defined]
        return [make(r) for r in self.conn.execute(sql, params)]

    def row(self, row_type: type[R], sql: str, params: Any = ()) -> R | None:
        """The first row of ``sql`` as a ``row_type``, or None."""
        r = self.conn.execute(sql, params).fetchone()
        return None if r is None else row_type._make(r)  # type: ignore[attr-defined]

    def scalar(self, sql: str, params: Any = (), default: Any = None) -> Any:
        row = self.conn.execute(sql, params).fetchone()
        return default if row is None or row[0] is None else row[0]

    def get_meta(self, key: str, default: str | None = None) -> str | None:
        return self.scalar("SELECT value FROM meta WHERE key=?", (key,), default)

    def set_meta(self, key: str, value: str) -> None:
        self.execute(
            "INSERT INTO meta(key, value) VALUES(?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
            (key, value),
        )

    def delete_meta(self, key: str) -> None:
        self.execute("DELETE FROM meta WHERE key=?", (key,))

    # A savepoint inside the operation: one part of it (a lease request of a batched pass) can
    # fail and be undone without failing the operation's other parts.
    def savepoint(self, name: str) -> None:
        self.execute(f"SAVEPOINT {name}")

    def release(self, name: str) -> None:
        """Keep what was done since :meth:`savepoint`."""
        self.execute(f"RELEASE {name}")

    def rollback_to(self, name: str) -> None:
        """Undo what was done since :meth:`savepoint` and end the savepoint."""
        self.execute(f"ROLLBACK TO {name}")
        self.execute(f"RELEASE {name}")


Op = Callable[[Tx], T]


@contextlib.contextmanager
def read_only(path: Path | str) -> Iterator[Tx]:
    """A :class:`Tx` over a finished run's store opened read-only (no writer thread, nothing
    written): for reading what only the store holds after the service is gone, through the
    storage functions rather than SQL of one's own."""
    conn = sqlite3.connect(f"file:{Path(path)}?mode=ro", uri=True, timeout=30.0)
    try:
        yield Tx(conn)
    finally:
        conn.close()


class StoreClosed(AstraFlowError, RuntimeError):
    pass


class Store:
    """SQLite store with a group-commit writer thread; see the module docstring."""

    def __init__(
        self,
        path: Path | str,
        *,
        synchronous: str = "FULL",
        max_group: int = 256,
        checkpoint_s: float = 0.5,
        wal_limit_bytes: int = WAL_LIMIT_BYTES,
    ):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.synchronous = synchronous
        self.max_group = max_group
        self.wal_limit_bytes = wal_limit_bytes
        #: checkpoints the writer ran itself because the WAL passed ``wal_limit_bytes``
        self.wal_resets = 0
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self.commits = 0
        self.ops = 0
        #: Wall time spent running operations / committing (benchmarks read these via /status).
        self.op_seconds = 0.0
        self.commit_seconds = 0.0
        self.max_commit_seconds = 0.0
        self._flusher: _WalFlusher | None = None
        ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name="dataflow-store", daemon=True
        )
        self._thread.start()
        ready.wait()
        if self._error is not None:
            raise self._error
        self.checkpoint_s = checkpoint_s
        self._stop_checkpoints = threading.Event()
        self._checkpointer = threading.Thread(
            target=self._checkpoint_loop, name="dataflow-checkpoint", daemon=True
        )
        self._checkpointer.start()

    # -- public API -------------------------------------------------------------------------
    async def run(self, op: Op[T]) -> T:
        """Run ``op`` in a transaction; returns once it is committed (or raises its error).

        The writer resolves the futures of one commit group with a single
        ``call_soon_threadsafe`` per event loop: far cheaper than a concurrent future per call.
        """
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._put((op, _AsyncSink(loop, fut)))
        return await fut

    def call(self, op: Op[T]) -> T:
        """Blocking variant of :meth:`run` for startup code and tests."""
        return self.submit(op).result()

    def submit(self, op: Op[T]) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._put((op, fut))
        return fut

    def _put(self, item) -> None:
        if self._closed:
            raise StoreClosed("the dataflow store is closed")
        if self._flusher is not None and self._flusher.failed is not None:
            raise StoreClosed(f"the dataflow store failed to flush its WAL: {self._flusher.failed}")
        self._queue.put(item)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop_checkpoints.set()
        self._checkpointer.join(timeout=30)
        self._queue.put(None)
        self._thread.join(timeout=30)

    # -- writer thread ----------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        # FULL: the flusher thread fsyncs the WAL before any reply (module docstring), so the
        # writer's own commits need not wait for the disk.
        mode = "NORMAL" if self.synchronous == "FULL" else self.synchronous
        conn.execute(f"PRAGMA synchronous={mode}")
        conn.execute("PRAGMA foreign_keys=OFF")
        conn.execute("PRAGMA temp_store=MEMORY")
        conn.execute("PRAGMA cache_size=-65536")
        conn.executescript(SCHEMA)
        _migrate(conn)
        # Checkpoints run on their own thread (below) so a commit never waits for the WAL to be
        # copied into the database file.
        conn.execute("PRAGMA wal_autocheckpoint=0")
        return conn

    def _checkpoint_loop(self) -> None:
        """PASSIVE checkpoints every ``checkpoint_s``: they never block the writer, and they keep
        the WAL from growing without bound (it restarts once a checkpoint caught up)."""
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA synchronous={self.synchronous}")
        try:
            while not self._stop_checkpoints.wait(self.checkpoint_s):
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                except sqlite3.Error:
                    pass
        finally:
            conn.close()

    def _run(self, ready: threading.Event) -> None:
        try:
            conn = self._connect()
        except BaseException as exc:  # surfaced by __init__
            self._error = exc
            ready.set()
            return
        if self.synchronous == "FULL":
            try:
                self._flusher = _WalFlusher(
                    Path(f"{self.path}-wal"),
                    self._finish,
                    lambda outcomes, exc: self._deliver([(s, None, exc) for s, _r, _e in outcomes]),
                )
            except BaseException as exc:  # surfaced by __init__
                conn.close()
                self._error = exc
                ready.set()
                return
        ready.set()
        stop = False
        while not stop:
            batch, stop = _drain(self._queue, self.max_group)
            if batch:
                self._run_group(conn, batch)
                self._bound_wal(conn)
        if self._flusher is not None:
            self._flusher.close()  # every reply of a committed group goes out first
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()

    def _bound_wal(self, conn: sqlite3.Connection) -> None:
        """Checkpoint the whole WAL into the database and truncate it once it passes
        ``wal_limit_bytes``.

        Why on the writer: the passive checkpoints of :meth:`_checkpoint_loop` never block it,
        but under a steady stream of commits they rarely catch up with the end of the WAL, and
        SQLite starts the WAL over only once one has: it grows until a lull lets one catch up, and
        the file keeps that size (half a gigabyte within three minutes of a busy run,
        bench/dataflow_scale.py). Between two groups the writer is
        the only one writing, so a TRUNCATE checkpoint completes; it holds the next group for the
        copy, once per ``wal_limit_bytes`` written. Frames of groups the flusher has not synced
        yet are in the database file, synced by the checkpoint, when it returns."""
        try:
            size = os.stat(f"{self.path}-wal").st_size
        except OSError:
            return
        if size > self.wal_limit_bytes:
            try:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                self.wal_resets += 1
            except sqlite3.Error:
                pass

    def _run_group(self, conn: sqlite3.Connection, batch: list) -> None:
        outcomes: list[tuple[Any, Any, BaseException | None]] = []
        hooks: list[Callable[[], None]] = []
        t0 = time.perf_counter()
        try:
            conn.execute("BEGIN IMMEDIATE")
            for op, sink in batch:
                if isinstance(sink, concurrent.futures.Future):
                    if not sink.set_running_or_notify_cancel():
                        continue
                elif sink.fut.cancelled():
                    continue
                tx = Tx(conn)
                conn.execute("SAVEPOINT op")
                try:
                    result = op(tx)
                except BaseException as exc:  # the caller gets it; other ops still commit
                    conn.execute("ROLLBACK TO op")
                    conn.execute("RELEASE op")
                    outcomes.append((sink, None, exc))
                    continue
                conn.execute("RELEASE op")
                hooks.extend(tx.after_commit)
                outcomes.append((sink, result, None))
            t1 = time.perf_counter()
            conn.execute("COMMIT")
            t2 = time.perf_counter()
        except BaseException as exc:  # commit failed: nothing in this group is durable
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            self._deliver([(sink, None, exc) for _op, sink in batch])
            return
        self.commits += 1
        self.ops += len(outcomes)
        self.op_seconds += t1 - t0
        self.commit_seconds += t2 - t1
        self.max_commit_seconds = max(self.max_commit_seconds, t2 - t1)
        if self._flusher is not None:
            self._flusher.put((hooks, outcomes))
        else:
            self._finish(hooks, outcomes)

    @property
    def flushes(self) -> int:
        """WAL flushes by the flusher thread (FULL only; see the module docstring)."""
        return 0 if self._flusher is None else self._flusher.flushes

    @property
    def flush_seconds(self) -> float:
        return 0.0 if self._flusher is None else self._flusher.flush_seconds

    def _finish(self, hooks: list[Callable[[], None]], outcomes: list) -> None:
        """A group is durable: post-commit hooks, then the replies."""
        for hook in hooks:
            try:
                hook()
            except Exception:  # a post-commit hook must never lose a committed reply
                pass
        self._deliver(outcomes)

    @staticmethod
    def _deliver(outcomes: list) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for sink, result, exc in outcomes:
            if isinstance(sink, concurrent.futures.Future):
                if sink.done():
                    continue
                if exc is None:
                    sink.set_result(result)
                else:
                    sink.set_exception(exc)
            else:
                by_loop.setdefault(sink.loop, []).append((sink.fut, result, exc))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_resolve, items)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass


class _WalFlusher:
    """The thread that makes committed groups durable (fsync of the WAL file) and then finishes
    them (:meth:`Store._finish`) in commit order; one fsync covers every group committed before
    it started, so under load a flush serves several groups.

    A failed fsync means the data the pending replies acknowledge may not be on disk: those
    callers get the error, and the store refuses further work (as PostgreSQL does after a failed
    fsync, since the kernel may have dropped the dirty pages)."""

    def __init__(
        self,
        wal: Path,
        finish: Callable[[list, list], None],
        fail: Callable[[list, OSError], None],
    ) -> None:
        self.wal = wal
        self._finish = finish
        self._fail = fail
        self.flushes = 0
        self.flush_seconds = 0.0
        #: the flush error after which nothing more is acknowledged
        self.failed: OSError | None = None
        self._fd = self._open()
        # the WAL's directory entry must survive a crash too (once: the file is reused)
        dir_fd = os.open(wal.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="dataflow-flush", daemon=True)
        self._thread.start()

    def _open(self) -> int:
        return os.open(self.wal, os.O_RDONLY | os.O_CREAT, 0o644)

    def put(self, group: tuple[list, list]) -> None:
        self._queue.put(group)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        os.close(self._fd)

    def _flush(self) -> None:
        # SQLite keeps the WAL file while connections are open and rewrites it in place, but if
        # it was ever replaced the flush must reach the file SQLite writes now
        try:
            current = os.stat(self.wal).st_ino
        except FileNotFoundError:
            current = None
        if current is not None and current != os.fstat(self._fd).st_ino:
            os.close(self._fd)
            self._fd = self._open()
        os.fsync(self._fd)

    def _run(self) -> None:
        while True:
            groups, stop = _drain(self._queue)
            if groups and self.failed is None:
                t0 = time.perf_counter()
                try:
                    self._flush()
                except OSError as exc:
                    self.failed = exc
                self.flushes += 1
                self.flush_seconds += time.perf_counter() - t0
            for hooks, outcomes in groups:
                if self.failed is None:
                    self._finish(hooks, outcomes)
                else:
                    self._fail(outcomes, self.failed)
            if stop:
                return


def _drain(q: queue.SimpleQueue, limit: int | None = None) -> tuple[list, bool]:
    """Wait for one item, then take every item already queued (up to ``limit``): the items to
    handle together, and whether the stop sentinel (None) came."""
    items: list = []
    item = q.get()
    while item is not None:
        items.append(item)
        if limit is not None and len(items) >= limit:
            return items, False
        try:
            item = q.get_nowait()
        except queue.Empty:
            return items, False
    return items, True


class _AsyncSink:
    __slots__ = ("loop", "fut")

    def __init__(self, loop: asyncio.AbstractEventLoop, fut: asyncio.Future) -> None:
        self.loop = loop
        self.fut = fut


def _resolve(items: list) -> None:
    """On the event loop: hand each caller its result (one callback per commit group)."""
    for fut, result, exc in items:
        if fut.done():
            continue
        if exc is None:
            fut.set_result(result)
        else:
            fut.set_exception(exc)
