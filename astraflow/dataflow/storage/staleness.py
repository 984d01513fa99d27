"""Staleness histogram (``staleness``): per (policy, staleness) the count of acknowledged samples
that many versions old; added to when a step is acknowledged, taken back when it is rewound."""

from __future__ import annotations

import sqlite3

from astraflow.dataflow.storage.store import Tx


def add(tx: Tx, rows: list[tuple[str, int, int]]) -> None:
    """Add (policy, staleness, count) rows to the histogram."""
    tx.executemany(
        "INSERT INTO staleness(policy, staleness, count) VALUES(?,?,?) "
        "ON CONFLICT(policy, staleness) DO UPDATE SET count = count + excluded.count",
        rows,
    )


def subtract(tx: Tx, rows: list[tuple[int, str, int]]) -> None:
    """Take (count, policy, staleness) rows back out (never below zero)."""
    tx.executemany(
        "UPDATE staleness SET count = MAX(0, count - ?) WHERE policy=? AND staleness=?",
        rows,
    )


def histogram(tx: Tx) -> sqlite3.Cursor:
    """(policy, staleness, count) rows by staleness (iterate it)."""
    return tx.execute("SELECT policy, staleness, count FROM staleness ORDER BY staleness")
