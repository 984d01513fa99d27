"""Node registration's defences: who may retire a namesake, idle registrations reaped, and a
registration quota per caller (issue 48, #7).

Why: every rollout node holds the same node token, so the token alone cannot tell an honest node
from a hostile one, and three things a node token could do harmed the others:

- ``replace=true`` with a victim's name retired the victim after two missed heartbeats: a
  stalled but honest node lost its leases to whoever said its name. Retiring a namesake now needs
  that node's own credential (the ``node_key`` its registration returned, sent as ``X-Node-Key``)
  or an admin token; a ``replace`` without it registers the new node and leaves the old one to
  the lease timeout and the idle reaper, as if ``replace`` had not been asked.
- registrations that never sent a heartbeat were never reaped, so 1,024 of them filled
  ``dataflow.max_nodes`` and every new node got 429 for the rest of the run. A registration
  silent for :func:`idle_bound_s` is now retired like a node that left (its leases go back to the
  queue); a live node heartbeats many times within that bound.
- registration had no rate: one caller could register as fast as the store could write. A token
  bucket per (role, client address) bounds how fast one caller adds registrations; admin tokens
  (the launcher, benchmarks, operators) are not limited.
"""

from __future__ import annotations

from astraflow.dataflow import storage
from astraflow.dataflow.ops import leasing
from astraflow.dataflow.ops.context import Context
from astraflow.dataflow.ops.rate_limits import NodeRateLimiter, RateLimited
from astraflow.dataflow.storage.store import Tx
from astraflow.protocol.auth import ADMIN

#: A registration silent this many lease timeouts is reaped ...
IDLE_LEASE_TIMEOUTS = 3.0
#: ... or this many heartbeat intervals, whichever is longer ...
IDLE_HEARTBEATS = 10.0
#: ... and never sooner than this (seconds).
MIN_IDLE_S = 60.0
#: Registrations reaped per pass (each pass is one transaction; the next pass takes the rest).
REAP_CHUNK = 256
#: Registrations one (role, client address) may make at once, then per second.
REGISTRATION_BURST = 64
REGISTRATIONS_PER_S = 1.0
#: Callers whose buckets are remembered (the oldest are forgotten first).
QUOTA_CALLERS = 4096


def idle_bound_s(ctx: Context) -> float:
    """How long a registration may stay silent before it is reaped."""
    heartbeat = ctx.heartbeat_s or ctx.config.heartbeat_interval_s
    return max(
        IDLE_LEASE_TIMEOUTS * ctx.config.lease_timeout_s, IDLE_HEARTBEATS * heartbeat, MIN_IDLE_S
    )


def reap_idle(ctx: Context, tx: Tx) -> list[str]:
    """Retire up to :data:`REAP_CHUNK` registrations silent past :func:`idle_bound_s`: their
    leases return to the queue and they leave (a later heartbeat of theirs is 404, and an honest
    node that was only paused registers again). Returns the ids retired."""
    reaped = storage.nodes.silent_since(tx, ctx.now() - idle_bound_s(ctx), REAP_CHUNK)
    for node_id in reaped:
        leasing.release_node(ctx, tx, node_id)
        storage.nodes.mark_left(tx, node_id)
    return reaped


def namesakes_to_retire(
    tx: Tx, name: str, silent_since: float, role: str | None, node_key: str | None
) -> list[str]:
    """The silent nodes called ``name`` that a ``replace`` registration may retire: all of them
    for an admin, else only the one whose credential ``node_key`` is (a restarted node that kept
    its key); none for a node token without the key."""
    silent = storage.nodes.silent_named(tx, name, silent_since)
    if role == ADMIN:
        return silent
    if not node_key:
        return []
    return [n for n in silent if storage.nodes.key_matches(tx, n, node_key)]


class RegistrationQuota:
    """A token bucket of registrations per (role, client address); admin is unlimited."""

    def __init__(self, clock=None) -> None:
        kwargs = {"clock": clock} if clock is not None else {}
        self._limiter = NodeRateLimiter(
            "registrations", REGISTRATIONS_PER_S, REGISTRATION_BURST, QUOTA_CALLERS, **kwargs
        )

    def check(self, role: str | None, client: str | None) -> None:
        if role == ADMIN:
            return
        caller = f"{role or 'unknown'} token from {client or 'an unknown address'}"
        try:
            self._limiter.check(caller)
        except RateLimited:
            raise RateLimited(
                f"registrations by the {caller} exceed {REGISTRATIONS_PER_S:g}/s (bursts of "
                f"{REGISTRATION_BURST}); registrations silent for long are reaped, so a node that "
                "keeps its registration and heartbeats never needs another",
                "name",
            ) from None
