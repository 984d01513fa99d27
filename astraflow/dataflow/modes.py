"""Asynchronous vs lock-step (``run.mode = "sync"``) training as one strategy object.

The two modes differ at a handful of points: which training tasks a node may lease (backpressure
vs the current round), when a node must load new weights first, which groups form a batch (any
ready ones vs exactly the round's), and what an ack or a version announcement sets off (nothing vs
the next round). Each point is one method here, so the lease, batch and service code carry no
``if sync`` branches and a reader finds everything lock-step mode does in one class.

Lock-step rounds: round ``r`` enqueues one optimizer step's worth of tasks, runs only on nodes that
hold version ``r`` of every trainable policy, and its batch holds exactly the round's groups; round
``r + 1`` starts once every trainable policy acknowledged round ``r``'s batch and announced version
``r + 1``. The current round is kept in the store's ``meta`` table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from astraflow.dataflow import batching, leases, storage
from astraflow.dataflow.context import Context
from astraflow.dataflow.store import Tx
from astraflow.protocol import BatchRequest, LeaseRequest


@dataclass(frozen=True)
class TrainingGate:
    """What a lease request may take from the training queue now."""

    #: training tasks it may start (backpressure); unlimited in lock-step mode
    room: int
    #: draw only from this round's tasks (lock-step mode), else from the whole queue
    round: int | None = None
    #: why it may take none (None: it may take up to ``room``)
    reason: str | None = None


class RunMode(Protocol):
    name: str

    def start(self, ctx: Context, tx: Tx) -> None:
        """At service start (in the startup transaction)."""

    def holds_back(self, newest: int, held: int, max_lag: int) -> bool:
        """A node holding ``held`` must load ``newest`` before it may take training work."""

    def training_gate(self, ctx: Context, tx: Tx, req: LeaseRequest) -> TrainingGate:
        """What a node that passed admission control may lease from the training queue."""

    def idle_reason(self, tx: Tx) -> str:
        """Why a request got fewer tasks than it asked for while training goes on."""

    def next_batch(self, ctx: Context, tx: Tx, req: BatchRequest) -> dict | None:
        """A new batch (BatchReply wire dict), or None when the trainer should wait."""

    def advance(self, ctx: Context, tx: Tx) -> None:
        """After an acknowledged step or an announced version (in the same transaction)."""

    def round(self, tx: Tx) -> int | None:
        """The current round (shown in the status), None when the mode has none."""


class Async:
    """Nodes run ahead of the trainer within ``max_lag`` versions; backpressure bounds the work."""

    name = "async"

    def start(self, ctx: Context, tx: Tx) -> None:
        pass

    def holds_back(self, newest: int, held: int, max_lag: int) -> bool:
        return newest - held > max_lag

    def training_gate(self, ctx: Context, tx: Tx, req: LeaseRequest) -> TrainingGate:
        room, reason = leases.buffer_room(ctx, tx)
        return TrainingGate(room=room, reason=reason)

    def idle_reason(self, tx: Tx) -> str:
        return "no pending tasks right now"

    def next_batch(self, ctx: Context, tx: Tx, req: BatchRequest) -> dict | None:
        return batching.next_async_batch(ctx, tx, req)

    def advance(self, ctx: Context, tx: Tx) -> None:
        pass

    def round(self, tx: Tx) -> int | None:
        return None


class LockStep:
    """Rounds: generate with version r, train one step on exactly that data, publish r + 1."""

    name = "sync"

    def start(self, ctx: Context, tx: Tx) -> None:
        if tx.get_meta("round") is None:
            self._start_round(ctx, tx, 0)

    def holds_back(self, newest: int, held: int, max_lag: int) -> bool:
        return True  # a round needs the latest version

    def training_gate(self, ctx: Context, tx: Tx, req: LeaseRequest) -> TrainingGate:
        round_ = self.round(tx)
        trainable = ctx.config.trainable
        behind = [p for p in trainable if req.versions.get(p, -1) != round_]
        reason = None
        if behind:
            reason = (
                f"sync mode: round {round_} runs only on nodes holding version {round_} "
                f"of {trainable}; this node holds "
                f"{ {p: req.versions.get(p) for p in trainable} }"
            )
        return TrainingGate(room=1 << 30, round=round_, reason=reason)

    def idle_reason(self, tx: Tx) -> str:
        return f"sync mode: round {self.round(tx)} has no more pending tasks"

    def next_batch(self, ctx: Context, tx: Tx, req: BatchRequest) -> dict | None:
        return batching.next_round_batch(ctx, tx, req, self.round(tx))

    def advance(self, ctx: Context, tx: Tx) -> None:
        """Start round r+1 once every trainable policy acked round r's batch and announced
        version r+1."""
        round_ = self.round(tx)
        latest = storage.versions.latest_versions(tx)
        for p in ctx.config.trainable:
            if not batching.round_acked(tx, p, round_):
                return
            if latest.get(p, -1) < round_ + 1:
                return
        self._start_round(ctx, tx, round_ + 1)

    def round(self, tx: Tx) -> int | None:
        return int(tx.get_meta("round", "0"))

    @staticmethod
    def _start_round(ctx: Context, tx: Tx, round_: int) -> None:
        tx.set_meta("round", str(round_))
        ctx.feeder.enqueue(tx, ctx.config.round_size, round_=round_)


def for_run_mode(mode: str) -> RunMode:
    """The strategy for a recipe's ``run.mode``."""
    return LockStep() if mode == "sync" else Async()
