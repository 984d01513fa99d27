"""Per-node rate limits: one node cannot take the single store writer from the others.

Why in memory: a limit protects the service's time now; after a restart every node starts with
a full bucket again, which is harmless. The table of buckets is bounded (nodes that left are
forgotten first), so a stream of fake node ids cannot grow it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from astraflow.dataflow.errors import DataflowError


class RateLimited(DataflowError):
    """A node calling faster than its limit: HTTP 429, naming the limit."""

    status = 429


class NodeRateLimiter:
    """A token bucket per node: ``burst`` calls at once, then ``per_s`` calls a second."""

    def __init__(
        self,
        what: str,
        per_s: float,
        burst: int,
        max_nodes: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what = what
        self.per_s = per_s
        self.burst = burst
        self.max_nodes = max_nodes
        self.clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def check(self, node_id: str) -> None:
        """Take one call from ``node_id``'s bucket, or raise :class:`RateLimited`."""
        now = self.clock()
        tokens, at = self._buckets.pop(node_id, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.per_s)
        if tokens < 1.0:
            self._buckets[node_id] = (tokens, now)
            raise RateLimited(
                f"{self.what} from node {node_id!r} exceed the limit of {self.per_s:g}/s "
                f"(bursts of {self.burst}); slow down",
                "node_id",
            )
        self._buckets[node_id] = (tokens - 1.0, now)
        while len(self._buckets) > self.max_nodes:
            self._buckets.popitem(last=False)
