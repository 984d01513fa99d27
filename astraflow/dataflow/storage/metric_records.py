"""Lines of ``metrics.jsonl`` (``metric_records``): one JSON body per step or evaluation record,
keyed by ``seq``; the file is appended from these after the commit and rewritten from them when a
timeline rewinds."""

from __future__ import annotations

import sqlite3

from astraflow.dataflow.storage.store import Tx


def insert(tx: Tx, body: str) -> int:
    """Store one record; returns its ``seq``."""
    cur = tx.execute("INSERT INTO metric_records(body) VALUES(?)", (body,))
    return cur.lastrowid


def all_unordered(tx: Tx) -> sqlite3.Cursor:
    """(seq, body) of every record, in no particular order (iterate it)."""
    return tx.execute("SELECT seq, body FROM metric_records")


def delete(tx: Tx, seqs: list[int]) -> None:
    tx.executemany("DELETE FROM metric_records WHERE seq=?", [(s,) for s in seqs])


def all_in_order(tx: Tx) -> list[tuple[int, str]]:
    """(seq, body) of every record, by ``seq``."""
    return tx.execute("SELECT seq, body FROM metric_records ORDER BY seq").fetchall()


def after(tx: Tx, seq: int) -> list[tuple[int, str]]:
    """(seq, body) of the records after ``seq``, by ``seq``."""
    return tx.execute(
        "SELECT seq, body FROM metric_records WHERE seq > ? ORDER BY seq", (seq,)
    ).fetchall()
