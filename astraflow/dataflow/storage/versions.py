"""Announced weight versions (``versions``: one row per policy and version)."""

from __future__ import annotations

from astraflow.dataflow.storage.store import Tx
from astraflow.protocol import WeightVersion


def latest_versions(tx: Tx) -> dict[str, int]:
    rows = tx.execute("SELECT policy, MAX(version) FROM versions GROUP BY policy").fetchall()
    return {p: v for p, v in rows}


def latest_weights(tx: Tx) -> dict[str, WeightVersion]:
    rows = tx.execute(
        "SELECT v.body FROM versions v JOIN (SELECT policy, MAX(version) AS mv FROM versions "
        "GROUP BY policy) m ON v.policy = m.policy AND v.version = m.mv"
    ).fetchall()
    out = {}
    for (body,) in rows:
        wv = WeightVersion.model_validate_json(body)
        out[wv.policy] = wv
    return out


def weight_locations(tx: Tx) -> dict[str, str]:
    return {p: wv.location for p, wv in latest_weights(tx).items()}


def weight_news(tx: Tx) -> tuple[dict[str, str], dict[str, str]]:
    """Where the latest version of each policy is, and its digest (what lease replies and
    heartbeats tell nodes: a node holding that version number with another digest reloads)."""
    latest = latest_weights(tx)
    return {p: wv.location for p, wv in latest.items()}, {p: wv.digest for p, wv in latest.items()}


def digest(tx: Tx, policy: str, version: int) -> str | None:
    """The digest ``version`` was announced with, or None when it was never announced."""
    row = tx.one(
        "SELECT json_extract(body, '$.digest') FROM versions WHERE policy=? AND version=?",
        (policy, version),
    )
    return None if row is None else row[0]


def delete_after(tx: Tx, policy: str, version: int) -> None:
    tx.execute("DELETE FROM versions WHERE policy=? AND version>?", (policy, version))


def record(tx: Tx, wv: WeightVersion, now: float) -> None:
    """Insert or update ``wv``; the same weights (same digest) keep their first announcement
    time, so evaluations of them stay valid."""
    tx.execute(
        "INSERT INTO versions(policy, version, body, created_at) VALUES(?,?,?,?) "
        "ON CONFLICT(policy, version) DO UPDATE SET body=excluded.body, created_at="
        "CASE WHEN json_extract(body, '$.digest') = json_extract(excluded.body, '$.digest') "
        "THEN created_at ELSE excluded.created_at END",
        (wv.policy, wv.version, wv.model_dump_json(), now),
    )
