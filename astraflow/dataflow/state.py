"""Small queries and updates shared by the service's operations (all run on the store thread)."""

from __future__ import annotations

import json

import msgpack

from astraflow.dataflow.config import ServiceConfig
from astraflow.dataflow.store import Tx
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


def count_drop(tx: Tx, policy: str, reason: str, n: int = 1) -> None:
    if n <= 0:
        return
    tx.execute(
        "INSERT INTO drops(policy, reason, count) VALUES(?,?,?) "
        "ON CONFLICT(policy, reason) DO UPDATE SET count = count + excluded.count",
        (policy, reason, n),
    )


def node_metrics(tx: Tx) -> dict[str, dict[str, float]]:
    """Each active node's latest heartbeat metrics (throughput, weight-sync times), by name."""
    out: dict[str, dict[str, float]] = {}
    for nid, body, metrics in tx.execute(
        "SELECT id, body, metrics FROM nodes WHERE state='active' ORDER BY registered_at"
    ):
        out[json.loads(body).get("name") or nid] = json.loads(metrics)
    return out


def drops(tx: Tx) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for policy, reason, count in tx.execute("SELECT policy, reason, count FROM drops"):
        out.setdefault(policy, {})[reason] = count
    return out


def count(tx: Tx, policy: str, name: str, n: int = 1) -> None:
    """Count something a dataflow policy did that is not a drop (e.g. replayed samples)."""
    if n <= 0:
        return
    tx.execute(
        "INSERT INTO counters(policy, name, count) VALUES(?,?,?) "
        "ON CONFLICT(policy, name) DO UPDATE SET count = count + excluded.count",
        (policy, name, n),
    )


def counters(tx: Tx) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for policy, name, n in tx.execute("SELECT policy, name, count FROM counters"):
        out.setdefault(policy, {})[name] = n
    return out


def remembered(tx: Tx, key: str | None, kind: str) -> bytes | None:
    """The stored reply of an earlier request with this idempotency key, if any."""
    if not key:
        return None
    row = tx.one("SELECT kind, result FROM idempotency WHERE key=?", (key,))
    if row is None:
        return None
    return row[1]


def remember(tx: Tx, key: str | None, kind: str, result: bytes, now: float) -> None:
    if key:
        tx.execute(
            "INSERT OR REPLACE INTO idempotency(key, kind, result, created_at) VALUES(?,?,?,?)",
            (key, kind, result, now),
        )


def pack(obj: object) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpack(data: bytes) -> object:
    return msgpack.unpackb(data, raw=False)


def steps(tx: Tx) -> dict[str, int]:
    rows = tx.execute(
        "SELECT policy, COUNT(*) FROM batches WHERE state='acked' GROUP BY policy"
    ).fetchall()
    return {p: n for p, n in rows}


def outstanding_training_tasks(tx: Tx) -> int:
    return tx.scalar("SELECT COUNT(*) FROM tasks WHERE is_eval=0 AND state != 'done'", (), 0)


def outstanding_evals(tx: Tx) -> int:
    """Evaluation tasks not finished yet that some node can run: an evaluation of a version that
    was never announced cannot run, so it must not keep the nodes from stopping forever."""
    latest = latest_versions(tx)
    rows = tx.execute(
        "SELECT eval_policy, min_version, COUNT(*) FROM tasks WHERE is_eval=1 AND state != 'done' "
        "GROUP BY eval_policy, min_version"
    ).fetchall()
    return sum(n for policy, v, n in rows if (v or 0) <= latest.get(policy, 0))


def training_done(tx: Tx, config: ServiceConfig, feeder_exhausted: bool) -> bool:
    """Every trainable policy acked max_steps batches (or, without trainers, tasks ran out)."""
    trainable = config.trainable
    if trainable:
        done_steps = steps(tx)
        if all(done_steps.get(p, 0) >= config.recipe.run.max_steps for p in trainable):
            return True
        return False
    return feeder_exhausted and outstanding_training_tasks(tx) == 0


def mark_done_time(tx: Tx, now: float) -> float:
    at = tx.get_meta("training_done_at")
    if at is None:
        tx.set_meta("training_done_at", repr(now))
        return now
    return float(at)


def node_versions(tx: Tx, node_id: str) -> dict[str, int] | None:
    row = tx.one("SELECT versions FROM nodes WHERE id=?", (node_id,))
    return None if row is None else json.loads(row[0])


def discard_token_arrays(tx: Tx, group_ids: list[str]) -> None:
    """Free the token arrays of samples no trainer will ever receive again (acked, filtered or
    dropped groups), so that the store stops growing with every episode of a long run. Ids,
    rewards and versions stay for the record."""
    tx.executemany(
        "UPDATE samples SET tokens=X'', loss_mask=X'', logprobs=X'', versions=X'' WHERE group_id=?",
        [(g,) for g in group_ids],
    )


#: Idempotency keys are kept this long (retries happen within minutes).
IDEMPOTENCY_TTL_S = 24 * 3600.0


def prune_idempotency(tx: Tx, now: float) -> int:
    return tx.execute(
        "DELETE FROM idempotency WHERE created_at < ?", (now - IDEMPOTENCY_TTL_S,)
    ).rowcount
