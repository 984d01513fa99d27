"""Publication off the trainer's critical path: the optimizer step returns after a host copy.

Why: publishing a version (hash every tensor, serialise, hash the file, compute the sparse
delta, write with fsync, announce) costs seconds per GB, and the trainer's ranks used to wait for
all of it after every step (35-60 s per version at 7B on a loaded machine). Here the caller's
thread only copies the weights to host memory (the trainer updates its tensors in place on the
next step, so they must be copied; at memcpy speed); one worker thread does the rest.

At most one publication runs: the next version waits only if the previous one is still being
written (a bounded queue of one, its wait counted), so a slow disk slows training instead of
piling versions up in memory. Versions stay atomic: the store renames a complete version
directory into place, so a trainer killed mid-publication leaves the previous version served.
A publication that failed raises on the next call (or :meth:`flush`), in the trainer's thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("astraflow.weights")

#: ``publish(version, state)``: writes and announces a version; ``state`` is the publisher's own
#: host copy, which the callee may keep (as the base of the next delta) until its next call
#: returns; after that the publisher refills it with a later version.
PublishFn = Callable[[int, dict[str, Any]], Any]


@dataclass
class PublisherStats:
    """What the trainer paid for the newest publication and what the worker did."""

    #: seconds the caller was blocked by the newest call (copy + any wait for the previous one)
    blocked_s: float = 0.0
    #: of which waiting for the previous publication to finish
    waited_s: float = 0.0
    #: seconds the worker spent on the newest finished publication
    publish_s: float = 0.0
    #: bytes of the newest snapshot (host copy)
    snapshot_bytes: int = 0
    publications: int = 0
    #: calls that had to wait for the previous publication
    waits: int = 0


def host_copy(state: Mapping[str, Any], into: dict[str, Any] | None = None) -> dict[str, Any]:
    """A private, contiguous CPU copy of every tensor (from any device), written into ``into``
    when it holds buffers of the same names, shapes and dtypes: refilling warm buffers runs at
    memcpy speed, where fresh ones pay a page fault per page (about 5x slower on a CPU host).
    Buffers for CUDA tensors are pinned, so the device-to-host copies run asynchronously."""
    import torch

    if (
        into is None
        or into.keys() != state.keys()
        or any(into[n].shape != t.shape or into[n].dtype != t.dtype for n, t in state.items())
    ):
        into = {
            n: torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda) for n, t in state.items()
        }
    cuda = False
    for name, t in state.items():
        into[name].copy_(t.detach(), non_blocking=t.is_cuda)
        cuda = cuda or t.is_cuda
    if cuda:
        torch.cuda.synchronize()
    return into


class BackgroundPublisher:
    """Wraps a blocking ``publish`` so a call returns once the state is copied to host memory."""

    def __init__(self, publish: PublishFn, name: str = "publisher") -> None:
        self._publish = publish
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"astraflow-{name}")
        self._pending: Future | None = None
        self._lock = threading.Lock()
        self.stats = PublisherStats()
        #: the snapshot of the newest publication (the callee may still hold it) and the one
        #: before it (released: refilled by the next call)
        self._current: dict[str, Any] | None = None
        self._retired: dict[str, Any] | None = None

    def __call__(self, version: int, state: Mapping[str, Any]) -> None:
        started = time.perf_counter()
        waited = self._wait_previous()
        snapshot = host_copy(state, into=self._retired)
        self._retired, self._current = self._current, snapshot
        with self._lock:
            self.stats.snapshot_bytes = sum(t.numel() * t.element_size() for t in snapshot.values())
            self._pending = self._pool.submit(self._run, version, snapshot)
            self.stats.blocked_s = time.perf_counter() - started
            self.stats.waited_s = waited
            self.stats.waits += waited > 0

    def _run(self, version: int, snapshot: dict[str, Any]) -> None:
        started = time.perf_counter()
        self._publish(version, snapshot)
        with self._lock:
            self.stats.publish_s = time.perf_counter() - started
            self.stats.publications += 1

    def _wait_previous(self) -> float:
        """Wait for the running publication; re-raise its error here, in the caller's thread."""
        pending = self._pending
        if pending is None:
            return 0.0
        started = time.perf_counter()
        busy = not pending.done()
        self._pending = None
        pending.result()  # raises the worker's exception
        return time.perf_counter() - started if busy else 0.0

    def flush(self) -> None:
        """Wait until the newest version is published (before a trainer exits or reports done)."""
        self._wait_previous()

    def close(self) -> None:
        """Flush, then stop the worker."""
        try:
            self.flush()
        finally:
            self._pool.shutdown(wait=True)
