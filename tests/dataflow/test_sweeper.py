"""The lease sweeper (the service's timer that expires overdue leases) logs its errors, with a
traceback, and keeps sweeping: a pass that fails must neither die silently nor stop later passes.

The failure is real, not mocked: the service's injected clock (``ServiceConfig.clock``) raises
for a while, as a broken time source would, so every sweeper pass fails inside the service.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from dataflow_helpers import TOKEN, ManualClock, ThreadedService, make_recipe

from astraflow.protocol.client import SyncDataflowClient

WAIT_S = 30.0


class _Records(logging.Handler):
    """Collects the service's log records and signals when one matching ``needle`` arrives."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.events: dict[str, threading.Event] = {}

    def expect(self, needle: str) -> threading.Event:
        return self.events.setdefault(needle, threading.Event())

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        for needle, event in self.events.items():
            if needle in record.getMessage():
                event.set()


def test_sweeper_logs_a_failed_pass_with_traceback_and_keeps_expiring_leases(tmp_path):
    clock = ManualClock(1_000.0)
    recipe = make_recipe(
        tmp_path,
        tasks={"group_size": 2, "epochs": 1, "sets": [{"name": "arith", "limit": 1}]},
        dataflow={"lease_timeout_s": 1.0, "buffer_steps": 0},
    )
    logger = logging.getLogger("astraflow.dataflow.ops.service")
    records = _Records()
    logger.addHandler(records)
    failed, recovered = records.expect("pass failed"), records.expect("recovered")
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        with (
            ThreadedService(recipe, tmp_path / "df.db", config_kwargs={"clock": clock}) as svc,
            SyncDataflowClient(svc.url, TOKEN, retries=0) as c,
            SyncDataflowClient(svc.url, TOKEN, retries=0) as c2,
        ):
            a = c.register(policies={"policy": 0}).node_id
            b = c.register(policies={"policy": 0}).node_id
            (taken,) = c.lease(node_id=a, max_tasks=1, versions={"policy": 0}).leases
            # b finds nothing and parks; only the sweeper expiring a's lease can wake it now
            parked = pool.submit(
                c2.lease, node_id=b, max_tasks=1, versions={"policy": 0}, wait_s=WAIT_S
            )
            deadline = time.monotonic() + 20
            while not svc.service._lease_waiters and time.monotonic() < deadline:
                time.sleep(0.01)  # until b's request is parked at the service
            assert svc.service._lease_waiters and not parked.done()
            clock.broken = True
            assert failed.wait(timeout=20), "a failed sweeper pass was not logged"
            clock.broken = False
            clock.advance(10.0)  # a went silent: its lease is now overdue
            grant = parked.result(timeout=WAIT_S + 10)
            assert [lease.task.id for lease in grant.leases] == [taken.task.id]
            assert recovered.wait(timeout=20), "the sweeper's recovery was not logged"
            assert not svc.service._sweeper.done()
    finally:
        logger.removeHandler(records)
        pool.shutdown(wait=False)
    failure = next(r for r in records.records if "pass failed" in r.getMessage())
    assert failure.levelno == logging.ERROR
    assert failure.exc_info is not None
    assert "clock source unavailable" in str(failure.exc_info[1])
    # one failure logged, not one per pass (passes run every 0.25 s while the clock is broken)
    assert sum("pass failed" in r.getMessage() for r in records.records) == 1
