"""Where a trainer's batches come from, and where it acknowledges them.

The trainer never generates: it pulls groups that rollout nodes produced, through a
:class:`BatchSource`. In a run that source is the dataflow service (:class:`DataflowBatchSource`,
over HTTP); in tests and in-process experiments it is an :class:`InProcessBatchSource` fed directly.
Both honour the same contract, which the trainer relies on:

* ``next_batch`` blocks (long-poll) until a batch exists, and raises :class:`SourceExhausted` when
  no batch will ever come again (the run is over), so the trainer can stop cleanly;
* ``ack`` is called exactly once per batch, only after the optimizer step on it has committed, with
  the version that step produced. A batch that is never acknowledged (the trainer died) is served
  again, so a crash loses no data.

This module imports neither torch nor transformers: the CLI and launchers may import it cheaply.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from astraflow.errors import AstraFlowError
from astraflow.protocol import Batch, BatchAck

__all__ = [
    "AckRecord",
    "BatchSource",
    "DataflowBatchSource",
    "InProcessBatchSource",
    "SourceExhausted",
]


class SourceExhausted(AstraFlowError):
    """No batch will ever be available again for this policy (the run is over)."""


@runtime_checkable
class BatchSource(Protocol):
    """What the trainer needs from the data layer: pull a batch, acknowledge it after the step."""

    def next_batch(self, policy: str, num_groups: int, trainer_version: int) -> Batch:
        """Block until a batch of up to ``num_groups`` groups of ``policy`` is available.

        ``trainer_version`` is the version of the weights the trainer holds now (so the source can
        apply its staleness bound). Raises :class:`SourceExhausted` when the run is over.
        """
        ...

    def ack(
        self,
        batch_id: str,
        trainer_version: int,
        metrics: dict[str, float],
        *,
        trained: bool = True,
        checkpoint_version: int | None = None,
        invalid_samples: dict[str, str] | None = None,
    ) -> None:
        """Acknowledge ``batch_id``: the step on it committed and produced ``trainer_version``.

        ``trained=False``: the batch was consumed without a step (nothing in it was trainable).
        ``checkpoint_version``: the newest version the trainer could restart from; a source that
        can serve batches again keeps those of later steps (see :class:`~astraflow.protocol.BatchAck`).
        """
        ...


@dataclass(frozen=True)
class AckRecord:
    """One acknowledgement as an :class:`InProcessBatchSource` recorded it."""

    batch_id: str
    trainer_version: int
    metrics: dict[str, float]
    trained: bool = True
    checkpoint_version: int | None = None


@dataclass
class InProcessBatchSource:
    """A batch source fed by Python code in the same process (tests, notebooks, sync baselines).

    Batches are either queued with :meth:`put`, or produced on demand by ``producer`` (called with
    ``(policy, num_groups, trainer_version)`` and returning a :class:`Batch`, or ``None`` once there
    is nothing more to train on). Acknowledgements are recorded in :attr:`acks`, in order.
    """

    producer: Any = None
    wait_s: float = 600.0
    acks: list[AckRecord] = field(default_factory=list)
    served: list[Batch] = field(default_factory=list)
    _queue: queue.Queue = field(default_factory=queue.Queue, repr=False)
    _closed: threading.Event = field(default_factory=threading.Event, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def put(self, batch: Batch) -> None:
        """Queue a batch for the trainer."""
        if self._closed.is_set():
            raise RuntimeError("cannot put a batch into a closed InProcessBatchSource")
        self._queue.put(batch)

    def close(self) -> None:
        """No more batches: once the queue drains, ``next_batch`` raises :class:`SourceExhausted`."""
        self._closed.set()

    def next_batch(self, policy: str, num_groups: int, trainer_version: int) -> Batch:
        if self.producer is not None and self._queue.empty() and not self._closed.is_set():
            batch = self.producer(policy, num_groups, trainer_version)
            if batch is None:
                self.close()
                raise SourceExhausted(f"producer has no more batches for policy {policy!r}")
            self.served.append(batch)
            return batch
        deadline_step = 0.05
        waited = 0.0
        while True:
            try:
                batch = self._queue.get(timeout=deadline_step)
            except queue.Empty:
                if self._closed.is_set():
                    raise SourceExhausted(f"no more batches for policy {policy!r}") from None
                waited += deadline_step
                if waited >= self.wait_s:
                    raise TimeoutError(
                        f"no batch for policy {policy!r} within {self.wait_s:.0f}s"
                    ) from None
                continue
            self.served.append(batch)
            return batch

    def ack(
        self,
        batch_id: str,
        trainer_version: int,
        metrics: dict[str, float],
        *,
        trained: bool = True,
        checkpoint_version: int | None = None,
        invalid_samples: dict[str, str] | None = None,
    ) -> None:
        with self._lock:
            if any(a.batch_id == batch_id for a in self.acks):
                raise RuntimeError(f"batch {batch_id} acknowledged twice")
            self.acks.append(
                AckRecord(batch_id, trainer_version, dict(metrics), trained, checkpoint_version)
            )


class DataflowBatchSource:
    """A :class:`BatchSource` over the dataflow service's HTTP API.

    ``client`` is an ``astraflow.protocol.client.SyncDataflowClient`` (or anything with the same
    ``next_batch(BatchRequest) -> BatchReply`` and ``ack(batch_id, BatchAck)`` methods). The request
    long-polls ``wait_s`` seconds at a time and repeats until a batch arrives, so a slow rollout
    pool only makes the trainer wait; a reply with ``done`` ends training.
    """

    def __init__(self, client: Any, *, trainer_id: str = "trainer", wait_s: float = 30.0) -> None:
        self._client = client
        self._trainer_id = trainer_id
        self._wait_s = wait_s

    @classmethod
    def connect(
        cls,
        url: str,
        token: str,
        *,
        trainer_id: str = "trainer",
        wait_s: float = 30.0,
        ca_file: str | None = None,
    ) -> DataflowBatchSource:
        """A source over a new ``SyncDataflowClient`` for the dataflow service at ``url``."""
        from astraflow.protocol.client import SyncDataflowClient

        return cls(
            SyncDataflowClient(url, token, ca_file=ca_file), trainer_id=trainer_id, wait_s=wait_s
        )

    def close(self) -> None:
        close = getattr(self._client, "close", None)
        if close is not None:
            close()

    def next_batch(self, policy: str, num_groups: int, trainer_version: int) -> Batch:
        from astraflow.protocol import BatchRequest

        request = BatchRequest(
            policy=policy,
            num_groups=num_groups,
            trainer_version=trainer_version,
            trainer_id=self._trainer_id,
            wait_s=self._wait_s,
        )
        while True:
            reply = self._client.next_batch(request)
            if reply.batch is not None:
                return reply.batch
            if reply.done:
                raise SourceExhausted(reply.reason or f"dataflow has no more data for {policy!r}")

    def ack(
        self,
        batch_id: str,
        trainer_version: int,
        metrics: dict[str, float],
        *,
        trained: bool = True,
        checkpoint_version: int | None = None,
        invalid_samples: dict[str, str] | None = None,
    ) -> None:
        clean = {k: float(v) for k, v in metrics.items() if _is_finite_number(v)}
        self._client.ack(
            batch_id,
            BatchAck(
                trainer_version=trainer_version,
                metrics=clean,
                trained=trained,
                checkpoint_version=checkpoint_version,
                invalid_samples=invalid_samples or {},
            ),
        )


def _is_finite_number(value: Any) -> bool:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return False
    return f == f and f not in (float("inf"), float("-inf"))
