"""Asynchronous vs lock-step (``run.mode = "sync"``) training as one strategy object.

The two modes differ at a handful of points: which training tasks a node may lease (backpressure
vs the current round), when a node must load new weights first, which groups form a batch (any
ready ones vs exactly the round's), and what an ack or a version announcement sets off (nothing vs
the next round). Each point is one method here, so the lease, batch and service code carry no
``if sync`` branches and a reader finds everything lock-step mode does in one class.

Why a leaf: the mode decides and the operations act. A mode reads the store and the service
config and answers (a :class:`TrainingGate`, a :class:`BatchPlan`, the round to start); it never
calls the operations (leasing, batching, the feeder), so the calls run one way, ops -> mode.

Lock-step rounds: round ``r`` enqueues one optimizer step's worth of tasks, runs only on nodes that
hold version ``r`` of every trainable policy, and its batch holds exactly the round's groups; round
``r + 1`` starts once every trainable policy acknowledged round ``r``'s batch and announced version
``r + 1``. The current round is kept in the store's ``meta`` table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from astraflow.dataflow import storage
from astraflow.dataflow.config import ServiceConfig
from astraflow.dataflow.storage.store import Tx
from astraflow.protocol import BatchRequest, LeaseRequest

#: Room that bounds nothing (no backpressure).
UNLIMITED = 1 << 30


@dataclass(frozen=True)
class TrainingGate:
    """What a lease request may take from the training queue now."""

    #: training tasks it may start (backpressure); unlimited in lock-step mode
    room: int
    #: draw only from this round's tasks (lock-step mode), else from the whole queue
    round: int | None = None
    #: why it may take none (None: it may take up to ``room``)
    reason: str | None = None


@dataclass(frozen=True)
class BatchPlan:
    """Which ready groups a trainer's new batch is drawn from, or why there is none now."""

    #: draw from round ``round``'s groups only (lock-step), else from every ready group
    round: int | None = None
    #: up to this many groups, waiting while fewer are ready unless no more data will come;
    #: None: every ready group (of the round) as it is
    num_groups: int | None = None
    #: the replay policy may fill slots from its pool and admit the batch's groups to it
    replays: bool = False
    #: no batch now: the trainer waits
    wait: bool = False
    #: no batch ever: the policy is done, for this reason
    done_reason: str | None = None


#: The trainer asks again later.
WAIT = BatchPlan(wait=True)


class RunMode(Protocol):
    name: str

    def start(self, tx: Tx) -> int | None:
        """At service start (in the startup transaction): the round to enqueue now, if any."""

    def holds_back(self, newest: int, held: int, max_lag: int) -> bool:
        """A node holding ``held`` must load ``newest`` before it may take training work."""

    def training_gate(self, tx: Tx, req: LeaseRequest) -> TrainingGate:
        """What a node that passed admission control may lease from the training queue."""

    def idle_reason(self, tx: Tx) -> str:
        """Why a request got fewer tasks than it asked for while training goes on."""

    def batch_plan(self, tx: Tx, req: BatchRequest, feeder_exhausted: bool) -> BatchPlan:
        """What a new batch for ``req`` is drawn from (``feeder_exhausted``: no task will be
        enqueued any more)."""

    def advance(self, tx: Tx) -> int | None:
        """After an acknowledged step or an announced version (in the same transaction): the
        round whose tasks to enqueue now, if one starts."""

    def round(self, tx: Tx) -> int | None:
        """The current round (shown in the status), None when the mode has none."""

    def observe_step(self, policy: str, step_s: float) -> None:
        """An optimizer step of ``policy`` was acknowledged ``step_s`` after its batch was served."""

    def observe_group(self, group_s: float) -> None:
        """A training group completed ``group_s`` after its task was leased."""

    def admission(self, policy: str) -> dict[str, float | int | None]:
        """What bounds ``policy``'s training work in flight now (for metrics and status)."""


@dataclass
class Pace:
    """The pipeline's measured pace: exponential moving averages of a trainer's step (batch
    served to acked: the trainer's own time, not its wait for data) and of a group (lease to the
    push that completed it). In memory: a restarted service measures afresh from its prior."""

    #: weight of the newest observation
    alpha: float = 0.3
    step_s: dict[str, float] = field(default_factory=dict)
    group_s: float | None = None

    def observe_step(self, policy: str, seconds: float) -> None:
        old = self.step_s.get(policy)
        self.step_s[policy] = seconds if old is None else old + self.alpha * (seconds - old)

    def observe_group(self, seconds: float) -> None:
        old = self.group_s
        self.group_s = seconds if old is None else old + self.alpha * (seconds - old)

    def steps_ahead(self, policy: str, bound: int) -> int:
        """Optimizer steps of groups worth having in flight or buffered for ``policy``: what
        keeps its trainer busy while groups are generated (Little's law: a step's groups every
        step time, each taking the group time, so ceil(group time / step time) steps of them),
        at least one and within ``bound``. One step until both are measured: the first steps
        train fresh samples. The batch a trainer is working on is not counted: one step ahead
        is the pipeline where a step trains samples one version old."""
        step, group = self.step_s.get(policy), self.group_s
        if step is None or group is None:
            return 1
        return max(1, min(bound, math.ceil(group / max(step, 1e-3))))


class Async:
    """Nodes run ahead of the trainer within ``max_lag`` versions; backpressure bounds the work."""

    name = "async"

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        self.pace = Pace()

    def start(self, tx: Tx) -> int | None:
        return None

    def holds_back(self, newest: int, held: int, max_lag: int) -> bool:
        return newest - held > max_lag

    def observe_step(self, policy: str, step_s: float) -> None:
        self.pace.observe_step(policy, step_s)

    def observe_group(self, group_s: float) -> None:
        self.pace.observe_group(group_s)

    def steps_ahead(self, policy: str) -> int:
        """Optimizer steps of ``policy``'s groups that may be in flight or buffered now."""
        dataflow = self.config.recipe.dataflow
        if dataflow.admission == "buffer":
            return dataflow.buffer_steps
        bound = min(dataflow.buffer_steps, max(1, self.config.recipe.max_lag_for(policy)))
        return self.pace.steps_ahead(policy, bound)

    def admission(self, policy: str) -> dict[str, float | int | None]:
        dataflow = self.config.recipe.dataflow
        steps = self.steps_ahead(policy) if dataflow.buffer_steps else None
        return {
            "steps_ahead": steps,
            "cap_groups": (
                steps * self.config.recipe.policies[policy].trainer.groups_per_step
                if steps is not None
                else None
            ),
            "step_s": self.pace.step_s.get(policy),
            "group_s": self.pace.group_s,
        }

    def training_gate(self, tx: Tx, req: LeaseRequest) -> TrainingGate:
        room, reason = self.buffer_room(tx)
        return TrainingGate(room=room, reason=reason)

    def buffer_room(self, tx: Tx) -> tuple[int, str | None]:
        """Staleness-aware admission: how many more training tasks may start now.

        A group leased now is trained after the groups in flight and buffered ahead of it, so
        they set how stale its samples will be; data beyond what keeps the trainer busy only
        grows that staleness (and, past the staleness bound, is generated to be dropped). So each
        trainable policy's buffered plus in-flight groups are capped at
        :meth:`steps_ahead` ``x groups_per_step``: with ``dataflow.admission = "pace"`` the steps
        the measured pace needs (ceil(group time / step time), one before it is measured),
        within ``buffer_steps`` and ``max_lag``; with ``"buffer"`` ``buffer_steps``. The tightest
        policy sets the room; ``buffer_steps = 0`` bounds nothing.
        """
        recipe = self.config.recipe
        steps = recipe.dataflow.buffer_steps
        if not steps or not self.config.trainable:
            return UNLIMITED, None
        in_flight = storage.leases.in_flight_training(tx)
        ready = storage.groups.ready_counts(tx)
        room, tightest = UNLIMITED, ""
        done_steps = storage.batches.steps(tx)
        for p in self.config.trainable:
            if done_steps.get(p, 0) >= recipe.run.max_steps:
                continue  # a finished policy consumes nothing more; it must not hold others back
            ahead = self.steps_ahead(p)
            cap = ahead * recipe.policies[p].trainer.groups_per_step
            free = cap - ready.get(p, 0) - in_flight
            if free < room:
                room, tightest = (
                    free,
                    (
                        f"backpressure: policy {p} has {ready.get(p, 0)} groups buffered and "
                        f"{in_flight} in flight (cap {cap} = {ahead} steps x groups_per_step; "
                        f"dataflow.admission = {recipe.dataflow.admission!r})"
                    ),
                )
        return (room, None) if room > 0 else (0, tightest)

    def idle_reason(self, tx: Tx) -> str:
        return "no pending tasks right now"

    def batch_plan(self, tx: Tx, req: BatchRequest, feeder_exhausted: bool) -> BatchPlan:
        return BatchPlan(num_groups=req.num_groups, replays=True)

    def advance(self, tx: Tx) -> int | None:
        return None

    def round(self, tx: Tx) -> int | None:
        return None


class LockStep:
    """Rounds: generate with version r, train one step on exactly that data, publish r + 1."""

    name = "sync"

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config

    def start(self, tx: Tx) -> int | None:
        if tx.get_meta("round") is None:
            return self._begin(tx, 0)
        return None

    def holds_back(self, newest: int, held: int, max_lag: int) -> bool:
        return True  # a round needs the latest version

    def observe_step(self, policy: str, step_s: float) -> None:
        return None  # a round's size is fixed: no pace to follow

    def observe_group(self, group_s: float) -> None:
        return None

    def admission(self, policy: str) -> dict[str, float | int | None]:
        return {"steps_ahead": 1, "cap_groups": None, "step_s": None, "group_s": None}

    def training_gate(self, tx: Tx, req: LeaseRequest) -> TrainingGate:
        round_ = self.round(tx)
        trainable = self.config.trainable
        behind = [p for p in trainable if req.versions.get(p, -1) != round_]
        reason = None
        if behind:
            reason = (
                f"sync mode: round {round_} runs only on nodes holding version {round_} "
                f"of {trainable}; this node holds "
                f"{ {p: req.versions.get(p) for p in trainable} }"
            )
        return TrainingGate(room=UNLIMITED, round=round_, reason=reason)

    def idle_reason(self, tx: Tx) -> str:
        return f"sync mode: round {self.round(tx)} has no more pending tasks"

    def batch_plan(self, tx: Tx, req: BatchRequest, feeder_exhausted: bool) -> BatchPlan:
        """Exactly the round's groups, once every task of it is done."""
        round_ = self.round(tx)
        if self.round_acked(tx, req.policy, round_):
            return WAIT  # waiting for the other policies and version announcements
        total, open_ = storage.tasks.round_progress(tx, round_)
        if total == 0:
            return BatchPlan(done_reason="task sets exhausted") if feeder_exhausted else WAIT
        if open_:
            return WAIT
        return BatchPlan(round=round_)

    @staticmethod
    def round_acked(tx: Tx, policy: str, round_: int) -> bool:
        """``policy`` acknowledged its batch of round ``round_``."""
        return storage.batches.round_acked(tx, policy, round_)

    def advance(self, tx: Tx) -> int | None:
        """Start round r+1 once every trainable policy acked round r's batch and announced
        version r+1."""
        round_ = self.round(tx)
        latest = storage.versions.latest_versions(tx)
        for p in self.config.trainable:
            if not self.round_acked(tx, p, round_):
                return None
            if latest.get(p, -1) < round_ + 1:
                return None
        return self._begin(tx, round_ + 1)

    def round(self, tx: Tx) -> int | None:
        return int(tx.get_meta("round", "0"))

    @staticmethod
    def _begin(tx: Tx, round_: int) -> int:
        tx.set_meta("round", str(round_))
        return round_


def for_run_mode(config: ServiceConfig) -> RunMode:
    """The strategy for the recipe's ``run.mode``."""
    return LockStep(config) if config.recipe.run.mode == "sync" else Async(config)
