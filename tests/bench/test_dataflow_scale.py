"""The scale benchmark's harness (``bench/dataflow_scale.py``): which lease grants count
as wake-ups and after which event, and the store's table sizes read through
``storage.history.table_sizes`` from a real dataflow store. The benchmark itself is not a timed
test."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def scale():
    sys.path.insert(0, str(BENCH))
    try:
        import dataflow_scale as module

        yield module
    finally:
        sys.path.remove(str(BENCH))


def test_a_wakeup_is_a_grant_to_a_request_parked_before_the_latest_event(scale):
    events = [
        (10.0, 10.01, 64),  # ready at once: the event is when the request was sent
        (20.0, 23.0, 64),  # waited for: the event is the reply (room freed as it was formed)
    ]
    leases = [
        (5.0, 10.04, 1),  # parked at 5, woken 40 ms after the event at 10
        (5.0, 10.5, 0),  # an empty answer is no wake-up
        (10.2, 10.3, 1),  # asked after the event: served, not woken
        (9.0, 23.02, 1),  # parked across both: counted from the later event
        (1.0, 9.0, 1),  # before any event
    ]
    assert scale.wakeups(leases, events) == pytest.approx([0.04, 0.02])


def test_table_sizes_count_rows_and_pages_per_table(tmp_path):
    from astraflow.dataflow.storage import history
    from astraflow.dataflow.storage.store import Store, read_only

    store = Store(tmp_path / "s.db")
    store.call(lambda tx: tx.set_meta("k", "v" * 5000))
    store.close()
    with read_only(tmp_path / "s.db") as tx:
        sizes = history.table_sizes(tx)
    assert sizes["meta"].rows >= 1 and sizes["meta"].bytes >= 5000
    assert sizes["samples"].rows == 0 and "sqlite_schema" not in sizes
