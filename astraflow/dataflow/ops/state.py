"""Small queries and updates shared by the service's operations (all run on the store thread)."""

from __future__ import annotations

import msgpack

from astraflow.dataflow import storage
from astraflow.dataflow.config import ServiceConfig
from astraflow.dataflow.storage.store import Tx


def pack(obj: object) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpack(data: bytes) -> object:
    return msgpack.unpackb(data, raw=False)


#: store meta key holding why the run was stopped (``POST /run/stop``)
STOPPED_KEY = "run_stopped"


def stopped(tx: Tx) -> str | None:
    """Why the run was stopped by an admin, or None while it runs (durable: a restarted
    service stays stopped)."""
    return tx.get_meta(STOPPED_KEY)


def stop(tx: Tx, reason: str) -> bool:
    """Stop the run; False when it was stopped already."""
    if stopped(tx) is not None:
        return False
    tx.set_meta(STOPPED_KEY, reason)
    return True


def outstanding_training_tasks(tx: Tx) -> int:
    return storage.tasks.outstanding_training(tx)


def outstanding_evals(tx: Tx) -> int:
    """Evaluation tasks not finished yet that some node can run: an evaluation of a version that
    was never announced cannot run, so it must not keep the nodes from stopping forever."""
    latest = storage.versions.latest_versions(tx)
    rows = storage.tasks.open_evaluations(tx)
    return sum(n for policy, v, n in rows if (v or 0) <= latest.get(policy, 0))


def training_done(tx: Tx, config: ServiceConfig, feeder_exhausted: bool) -> bool:
    """Every trainable policy acked max_steps batches (or, without trainers, tasks ran out), or
    an admin stopped the run."""
    if stopped(tx) is not None:
        return True
    trainable = config.trainable
    if trainable:
        done_steps = storage.batches.steps(tx)
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
