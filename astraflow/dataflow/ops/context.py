"""Everything an operation needs besides the transaction: config, policies, feeder, metrics log."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from astraflow.dataflow.config import ServiceConfig
from astraflow.dataflow.ops.metrics import MetricsLog
from astraflow.dataflow.ops.modes import RunMode
from astraflow.dataflow.ops.task_feeder import TaskFeeder
from astraflow.dataflow.policies import Pipeline
from astraflow.protocol.messages import PolicyFacts

if TYPE_CHECKING:
    from astraflow.dataflow.ops.transcript_sampling import TranscriptSampler
    from astraflow.dataflow.storage.store import Tx


def heartbeat_interval(config: ServiceConfig, active_nodes: int) -> float:
    """The heartbeat interval to ask of each of ``active_nodes`` nodes.

    Why it grows with the pool: every heartbeat is a write transaction on the store's one writer
    thread, so a fixed interval makes the service's heartbeat load grow with the pool (2,048 a
    second from 4,096 nodes at 2 s, about a core by itself; bench/dataflow_scale.py). The
    pool as a whole is held to ``dataflow.max_heartbeats_per_s``; an interval stays below a
    quarter of the lease timeout, so a live node renews its leases several times before they
    expire."""
    df = config.recipe.dataflow
    paced = max(config.heartbeat_interval_s, active_nodes / df.max_heartbeats_per_s)
    return round(min(paced, max(config.heartbeat_interval_s, config.lease_timeout_s / 4)), 3)


@dataclass
class Context:
    config: ServiceConfig
    pipeline: Pipeline
    feeder: TaskFeeder
    metrics: MetricsLog
    #: async or lock-step (``run.mode``): every point where the two differ
    mode: RunMode
    #: Called (on a store thread, once the commit is durable) when an operation changed what a
    #: long poll waits for; the service sets it to wake parked lease and batch requests. Must be
    #: thread-safe.
    wake: Callable[[], None] | None = None
    #: keeps a few finished episodes per step for people (``logging.transcripts_per_step``)
    transcripts: TranscriptSampler | None = None
    #: each policy's model facts (vocabulary, context length) from the trainer's latest
    #: announcement; None: not read yet (:func:`policy_facts`; an announcement resets it)
    facts: dict[str, PolicyFacts] | None = None
    #: the heartbeat interval nodes are asked for now (:func:`heartbeat_interval`); None: the
    #: recipe's ``heartbeat_interval_s``
    heartbeat_s: float | None = None

    def now(self) -> float:
        return self.config.clock()

    def pace_heartbeats(self, active_nodes: int) -> float:
        """Set and return the interval nodes are asked to heartbeat at, for ``active_nodes``."""
        self.heartbeat_s = heartbeat_interval(self.config, active_nodes)
        return self.heartbeat_s

    def policy_facts(self, tx: Tx) -> dict[str, PolicyFacts]:
        """What pushed tokens are checked against, per policy (read once, then cached)."""
        if self.facts is None:
            from astraflow.dataflow import storage

            self.facts = {
                policy: PolicyFacts(wv.vocab_size, wv.context_length)
                for policy, wv in storage.versions.latest_weights(tx).items()
            }
        return self.facts

    def wake_after_commit(self, tx: Tx) -> None:
        """Once ``tx`` commits, wake the long polls: it put tasks back on the queue, completed a
        task (a new group, a finished evaluation) or otherwise changed what they wait for.

        The operations that do so are found inside other operations (expiry happens in whichever
        request notices it first; most pushes complete nothing), so the wake-up is attached to
        the transaction rather than to any one endpoint."""
        if self.wake is not None and self.wake not in tx.after_commit:
            tx.after_commit.append(self.wake)

    def start_mode(self, tx: Tx) -> None:
        """At service start: enqueue the first round if the run mode has rounds."""
        self._enqueue_round(tx, self.mode.start(tx))

    def advance_mode(self, tx: Tx) -> None:
        """After an acknowledged step or an announced version: enqueue the round the run mode
        starts now, if any."""
        self._enqueue_round(tx, self.mode.advance(tx))

    def _enqueue_round(self, tx: Tx, round_: int | None) -> None:
        if round_ is not None:
            self.feeder.enqueue(tx, self.config.round_size, round_=round_)
