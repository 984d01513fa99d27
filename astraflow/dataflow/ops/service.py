"""The dataflow service's operations, independent of HTTP.

Each public coroutine runs one operation as a transaction on the store's writer thread (see
:mod:`astraflow.dataflow.storage.store`) and returns only after the commit. Long polls (batch and
lease requests with ``wait_s``) wait outside any transaction for a signal raised by the operations
that can create what they wait for (pushes, acks, version announcements, released or expired leases,
evaluation requests), then try again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from astraflow.dataflow import storage
from astraflow.dataflow.config import ServiceConfig
from astraflow.dataflow.errors import Forbidden, Invalid, TooMany
from astraflow.dataflow.ops import (
    adaptive,
    batching,
    evaluating,
    ingest,
    leasing,
    modes,
    resuming,
    state,
    timeline,
)
from astraflow.dataflow.ops import status as status_mod
from astraflow.dataflow.ops import transcript_sampling as transcripts_mod
from astraflow.dataflow.ops.context import Context
from astraflow.dataflow.ops.metrics import MetricsLog
from astraflow.dataflow.ops.modes import RunMode
from astraflow.dataflow.ops.rate_limits import NodeRateLimiter
from astraflow.dataflow.ops.refusals import DISCARDED_SAVES, Refusals
from astraflow.dataflow.ops.registration import (
    RegistrationQuota,
    namesakes_to_retire,
    reap_idle,
)
from astraflow.dataflow.ops.task_feeder import TaskFeeder, TaskSource
from astraflow.dataflow.policies import Pipeline, PolicyRegistry
from astraflow.dataflow.storage.store import Store, Tx
from astraflow.protocol import (
    Ack,
    BatchAck,
    BatchRequest,
    EvaluationRequest,
    EvaluationResult,
    Heartbeat,
    HeartbeatReply,
    LeaseGrant,
    LeaseRelease,
    LeaseRequest,
    NodeRegistered,
    NodeRegistration,
    PartialPush,
    PartialResult,
    PushResult,
    RunStop,
    TrajectoryPush,
    WeightVersion,
    new_id,
)
from astraflow.protocol.auth import ADMIN
from astraflow.protocol.prometheus import ServiceMetrics

log = logging.getLogger(__name__)

#: Heartbeats a node may send at once before its rate limit applies.
HEARTBEAT_BURST = 20


@dataclass(eq=False)
class _LeaseWaiter:
    """A parked lease request: answered by the lease dispatcher (:meth:`DataflowService.lease`)."""

    req: LeaseRequest
    fut: asyncio.Future
    #: the latest empty answer, returned when the wait runs out
    last: LeaseGrant
    #: a dispatch pass that includes this request is under way
    in_pass: bool = False
    #: the wait ran out during such a pass: the pass answers it whatever it finds
    expired: bool = False


class _HeartbeatNews(NamedTuple):
    """What a heartbeat reply tells every node (:func:`.leasing.node_news`), as read when
    ``DataflowService._news_generation`` was ``generation``."""

    generation: int
    reply: HeartbeatReply


def _held_back(
    config: ServiceConfig, mode: RunMode, req: LeaseRequest, latest: dict[str, int]
) -> bool:
    """The node's training work is held back until it loads other weights: admission control
    (more than ``max_lag`` versions behind, or ahead of a timeline that rewound) or a run mode that
    always needs the latest version (lock-step rounds, :mod:`.modes`). A node behind by ``max_lag`` or less may take work with the weights it has, so its
    request parks like any other; telling it at once would only send it away: a node that loads
    a version more slowly than the trainer publishes them (a remote region over a slow link) was
    then never parked, and got work only when some happened to be free at the instant it asked."""
    for policy, held in req.versions.items():
        newest = latest.get(policy, -1)
        if newest < 0 or newest == held:
            continue
        if newest < held:  # a rewound timeline (trainer restarted): those weights are gone
            return True
        try:
            bound = config.recipe.max_lag_for(policy)
        except KeyError:  # a policy the recipe does not know: treat as held back (answer now)
            return True
        if mode.holds_back(newest, held, bound):
            return True
    return False


def _news(waiter: _LeaseWaiter, outcome: LeaseGrant) -> bool:
    """A version the node does not hold was announced since its request last looked.

    The node learns of new weights from lease replies and heartbeats (seconds apart). Keeping the
    request parked would leave it on old weights until its next heartbeat: answer it now, empty,
    with the new versions. A node held back (:func:`_held_back`) then loads them before asking
    again; one within ``max_lag`` asks again at once, so it stays parked while its weights load
    (a node that loads more slowly than the trainer publishes still gets work)."""
    before, after = waiter.last.latest_versions, outcome.latest_versions
    if before is after or before == after:  # nothing announced since it last looked
        return False
    return any(
        after.get(policy, -1) > max(held, before.get(policy, -1))
        or after.get(policy, held) < min(held, before.get(policy, held))  # a rewind
        for policy, held in waiter.req.versions.items()
    )


def _answer(
    config: ServiceConfig, mode: RunMode, req: LeaseRequest, outcome: LeaseGrant
) -> LeaseGrant:
    """The grant as sent: an empty one says whether the node must load new weights first."""
    if outcome.leases or outcome.done or not _held_back(config, mode, req, outcome.latest_versions):
        return outcome
    return outcome.model_copy(update={"update_first": True})


def _throttle(loop: asyncio.AbstractEventLoop, last_start: float, last_end: float) -> float:
    """How long to hold a scan that follows another one back to back.

    Under load every push signals, and a scan per push would cost more than the pushes themselves.
    Spacing scans by at least one scan's duration (measured end to end, store queueing included)
    caps scanning at about half the writer's time, and coalesces every signal raised meanwhile into
    the next scan; a signal after an idle spell is served at once (no fixed delay)."""
    return max(0.0, last_end + (last_end - last_start) - loop.time())


class DataflowService:
    def __init__(
        self,
        config: ServiceConfig,
        store_path: Path | str,
        *,
        task_source: TaskSource,
        registry: PolicyRegistry | None = None,
        synchronous: str = "FULL",
    ) -> None:
        self.config = config
        pipeline = Pipeline.from_config(config.recipe.dataflow.policies, registry)
        if pipeline.adaptive:
            # adaptive weights act on tasks as they are enqueued: keep the pending window to about
            # one optimizer step so a changed weight shows within a step, not many steps later
            per_step = max(p.trainer.groups_per_step for p in config.recipe.policies.values())
            config.task_window = min(config.task_window, per_step)
        feeder = TaskFeeder(config, pipeline, task_source)
        self.ctx = Context(
            config,
            pipeline,
            feeder,
            MetricsLog(config.metrics_path),
            modes.for_run_mode(config),
            transcripts=transcripts_mod.TranscriptSampler(
                config.recipe.logging.transcripts_per_step
            ),
        )
        self.store = Store(store_path, synchronous=synchronous)
        #: this service's own histograms for ``/metrics`` (the rest comes from its status)
        self.metrics = ServiceMetrics()
        self.lease_wait = self.metrics.histogram(
            "astraflow_lease_wait_seconds",
            "Seconds from a lease request to the leases it got (long-poll wake-up)",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30),
        )
        self.refusals = Refusals()
        # A node heartbeats once per interval; ten times that rate (bursts of 20) is a runaway.
        self._heartbeat_limit = NodeRateLimiter(
            "heartbeats",
            per_s=10.0 / config.heartbeat_interval_s,
            burst=HEARTBEAT_BURST,
            max_nodes=2 * config.recipe.dataflow.max_nodes,
        )
        self._registration_quota = RegistrationQuota()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Event | None = None
        self._sweeper: asyncio.Task | None = None
        #: parked lease requests, oldest first (dicts keep insertion order)
        self._lease_waiters: dict[int, _LeaseWaiter] = {}
        #: grants of hung-up lease requests being returned (kept referenced until done)
        self._returns: set[asyncio.Task] = set()
        self._lease_kick: asyncio.Event | None = None
        self._lease_dispatcher: asyncio.Task | None = None
        self._done_timer: asyncio.TimerHandle | None = None
        #: bumped by every signal: a request that saw no work re-checks if it moved meanwhile
        self._generation = 0
        #: Heartbeats answered without a transaction (:meth:`heartbeat`): the nodes a
        #: transactional heartbeat found active (dropped when they leave), what every reply
        #: tells (with the generation it was read at, and whether only a signal changes it), and
        #: the heartbeats not yet persisted (node -> heartbeat, time), written by one operation
        #: at a time (:meth:`_persist_liveness`).
        self._live_nodes: set[str] = set()
        self._news: _HeartbeatNews | None = None
        #: bumped after every operation that can change that news: a version announced (or
        #: re-announced: a rewind), a batch acked (training may be done), the run stopped
        self._news_generation = 0
        self._beats: dict[str, Heartbeat] = {}
        self._beat_times: dict[str, float] = {}
        self._liveness_writer: asyncio.Task | None = None
        self.store.call(self._init)

    def _init(self, tx: Tx) -> None:
        self.ctx.metrics.recover(tx)
        adaptive.load(self.ctx, tx)
        for key in self.ctx.feeder.sets:  # fail at startup on a bad task set, not later
            self.ctx.feeder.payloads(key)
        self.ctx.start_mode(tx)

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        self._lease_kick = asyncio.Event()
        self.ctx.wake = lambda: loop.call_soon_threadsafe(self._signal)
        self._sweeper = asyncio.create_task(self._sweep())
        self._lease_dispatcher = asyncio.create_task(self._dispatch_leases())

    async def stop(self) -> None:
        if self._done_timer is not None:
            self._done_timer.cancel()
        for task in (self._sweeper, self._lease_dispatcher):
            if task:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        if self._liveness_writer is not None:
            await asyncio.gather(self._liveness_writer, return_exceptions=True)
        self.ctx.wake = None
        try:
            await self.record_run_summary()
        except Exception as exc:  # noqa: BLE001 - a summary must not keep the store from closing
            log.warning("could not record the run summary in metrics.jsonl: %s", exc)
        self.store.close()

    async def record_run_summary(self) -> None:
        """Append a ``run_summary`` record to metrics.jsonl: the status document as the service
        stops plus :func:`storage.run_summary.read`, so what a finished run did is read from its
        metrics file, not from its store. A restarted service appends another; the last one
        describes the run."""
        doc = await self.status()

        def write(tx: Tx) -> None:
            record = {"type": "run_summary", **storage.run_summary.read(tx)}
            record["status"] = doc.model_dump(mode="json")
            record["time"] = self.ctx.now()
            self.ctx.metrics.record(tx, record)

        await self.store.run(write)

    def _signal(self) -> None:
        """Wake long polls (batch and lease requests): something they wait for may have changed.

        Called on the event loop after the commit of every operation that can create work:
        acks, version announcements, evaluation requests, and (through ``ctx.wake``, from the
        store's thread) pushes that completed a task and anything that put leased tasks back on
        the queue."""
        self._generation += 1
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()
        if self._lease_kick is not None and self._lease_waiters:
            self._lease_kick.set()

    def _wake_at(self, at: float | None) -> None:
        """Signal when the run turns done by the clock alone (the done grace period ends)."""
        if at is None or self._loop is None or not self._lease_waiters:
            return
        delay = max(0.001, at - self.ctx.now() + 0.001)
        when = self._loop.time() + delay
        if self._done_timer is not None and self._done_timer.when() <= when:
            return
        if self._done_timer is not None:
            self._done_timer.cancel()
        self._done_timer = self._loop.call_at(when, self._done_timer_fired)

    def _done_timer_fired(self) -> None:
        self._done_timer = None
        self._signal()

    async def _sweep(self) -> None:
        """Expire overdue leases every ``lease_timeout_s / 4`` (at most a second), pace the
        nodes' heartbeats to the pool's size (:func:`.context.heartbeat_interval`) and prune old
        idempotency keys every 10 minutes, for as long as the service runs.

        A failed pass is logged with its traceback and the next pass runs as usual: a sweeper that
        died, or failed silently, would leave a dead node's tasks leased until some other request
        happened to expire them. A failure that repeats is logged again at most once a minute (the
        same broken store fails every pass), and the first pass that succeeds after failures says
        so."""
        interval = max(0.05, min(1.0, self.config.lease_timeout_s / 4))
        last_prune = 0.0
        failing_since: float | None = None
        last_logged = 0.0
        while True:
            await asyncio.sleep(interval)
            try:
                now = self.ctx.now()
                if now - last_prune > 600:
                    last_prune = now
                    # in chunks, each its own transaction: other requests run in between
                    chunk = storage.idempotency.PRUNE_CHUNK
                    while chunk == storage.idempotency.PRUNE_CHUNK:
                        chunk = await self.store.run(
                            lambda tx: storage.idempotency.prune(tx, self.ctx.now())
                        )
                # expiry wakes parked lease requests through ctx.wake
                await self.store.run(lambda tx: leasing.expire_overdue(self.ctx, tx))
                # registrations silent past the idle bound leave (issue 48 #7)
                reaped = await self.store.run(lambda tx: reap_idle(self.ctx, tx))
                if reaped:
                    self._end_parked(reaped)
                    self._signal()
                # the pool's size sets the heartbeat interval nodes are asked for
                active = await self.store.run(storage.nodes.count_active)
                self.ctx.pace_heartbeats(active)
            except asyncio.CancelledError:
                raise
            except Exception:
                mono = asyncio.get_running_loop().time()
                if failing_since is None or mono - last_logged >= 60.0:
                    log.exception(
                        "lease sweeper: pass failed (overdue leases stay leased until a pass "
                        "succeeds); retrying every %.2fs",
                        interval,
                    )
                    last_logged = mono
                failing_since = failing_since if failing_since is not None else mono
            else:
                if failing_since is not None:
                    log.warning(
                        "lease sweeper: recovered after %.1fs of failed passes",
                        asyncio.get_running_loop().time() - failing_since,
                    )
                    failing_since = None

    # -- nodes --------------------------------------------------------------------------------
    async def register(
        self,
        reg: NodeRegistration,
        role: str | None = ADMIN,
        node_key: str | None = None,
        client: str | None = None,
    ) -> NodeRegistered:
        """Register a node. ``role``/``node_key``/``client``: the caller's token role, the
        ``X-Node-Key`` it sent and its address (:mod:`.registration`: who may retire a
        namesake, the registration quota); the default is an in-process admin caller."""
        self._registration_quota.check(role, client)
        presented_key = node_key
        replaced: list[str] = []

        def op(tx: Tx) -> NodeRegistered:
            now = self.ctx.now()
            replaced.clear()
            replaced.extend(reap_idle(self.ctx, tx))  # stale registrations never lock out a node
            if reg.replace and reg.name:
                interval = self.ctx.heartbeat_s or self.config.heartbeat_interval_s
                silent_since = now - 2 * interval
                for old in namesakes_to_retire(tx, reg.name, silent_since, role, presented_key):
                    leasing.release_node(self.ctx, tx, old)
                    storage.nodes.mark_left(tx, old)
                    replaced.append(old)
            active = storage.nodes.count_active(tx)
            limit = self.config.recipe.dataflow.max_nodes
            if active >= limit:
                raise TooMany(
                    f"{active} nodes are registered, the limit is {limit} (MAX_NODES, "
                    "dataflow.max_nodes); deregister nodes that left",
                    "name",
                )
            node_id = new_id("node")
            storage.nodes.insert(tx, node_id, reg.model_dump_json(), reg.policies, now)
            node_key = storage.nodes.issue_key(tx, node_id)
            return NodeRegistered(
                node_id=node_id,
                node_key=node_key,
                heartbeat_interval_s=self.ctx.pace_heartbeats(active + 1),
                lease_timeout_s=self.config.lease_timeout_s,
                latest_versions=storage.versions.latest_versions(tx),
                max_lag=self.config.recipe.dataflow.max_lag,
                group_size=self.config.recipe.tasks.group_size,
            )

        result = await self.store.run(op)
        self._end_parked(replaced)
        if replaced:
            self._signal()  # a replaced or reaped node's leases went back to the queue
        return result

    async def heartbeat(self, node_id: str, hb: Heartbeat) -> HeartbeatReply:
        """A node's sign of life; renews the leases it holds.

        Why most heartbeats are answered without a transaction: a heartbeat was a write
        transaction on the store's one writer, queued behind every lease pass and push, so at
        4,096 nodes heartbeats waited hundreds of milliseconds for the writer
        (bench/dataflow_scale.py) although most of them renewed nothing: only the nodes
        running a group hold leases. A node that reports no lease in flight and is known active is
        answered at once from the news the last transactional heartbeat read (versions, weights,
        stop), unless an operation that can change it (an announcement, an ack, a stop) ran since,
        or the run is done or in its done grace period; its liveness (time, versions, metrics) is persisted by the next liveness write,
        one operation for every heartbeat that arrived meanwhile. Renewals stay transactional:
        a heartbeat with leases in flight is answered only once their new deadlines are durable.
        What a crash can lose is the last seconds of liveness of idle nodes, which leases do not
        depend on."""
        self._heartbeat_limit.check(node_id)
        news = self._news
        if (
            not hb.in_flight
            and news is not None
            and news.generation == self._news_generation
            and node_id in self._live_nodes
        ):
            self._beats[node_id] = hb
            self._beat_times[node_id] = self.ctx.now()
            if self._liveness_writer is None or self._liveness_writer.done():
                self._liveness_writer = asyncio.ensure_future(self._persist_liveness())
            return news.reply.model_copy(
                update={
                    "heartbeat_interval_s": self.ctx.heartbeat_s or self.config.heartbeat_interval_s
                }
            )
        generation = self._news_generation

        def op(tx: Tx) -> tuple[HeartbeatReply, HeartbeatReply, bool]:
            reply = leasing.heartbeat(self.ctx, tx, node_id, hb)
            return (reply, *leasing.node_news(self.ctx, tx, reply))

        reply, news_now, settled = await self.store.run(op)
        self._live_nodes.add(node_id)
        if settled and generation == self._news_generation:
            self._news = _HeartbeatNews(generation, news_now)
        return reply

    async def _persist_liveness(self) -> None:
        """Write the heartbeats answered without a transaction, all that arrived meanwhile in one
        operation, until none is left (event-driven: no timer)."""
        while self._beats:
            beats, times = self._beats, self._beat_times
            self._beats, self._beat_times = {}, {}
            try:
                await self.store.run(
                    lambda tx, b=beats, t=times: leasing.record_liveness(self.ctx, tx, b, t)
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - liveness only: the next heartbeat retries
                log.warning("could not persist %d nodes' heartbeats: %s", len(beats), exc)

    async def deregister(self, node_id: str, node_key: str | None = None) -> Ack:
        """The node leaves; ``node_key``: the caller's credential (None: an admin, who may
        deregister any node). A node token may deregister only the node it registered."""

        def op(tx: Tx) -> Ack:
            if node_key is not None and not storage.nodes.key_matches(tx, node_id, node_key):
                raise Forbidden(
                    "a node token may deregister only its own node: send the node_key its "
                    "registration returned as the X-Node-Key header",
                    "X-Node-Key",
                )
            leasing.touch_node(self.ctx, tx, node_id, None)
            n = leasing.release_node(self.ctx, tx, node_id)
            storage.nodes.mark_left(tx, node_id)
            return Ack(detail=f"node left; {n} lease(s) returned to the queue")

        result = await self.store.run(op)
        self._end_parked([node_id])  # its own parked request gets a 404
        self._signal()  # its leases went back to the queue
        return result

    # -- leases and pushes --------------------------------------------------------------------
    async def lease(self, req: LeaseRequest) -> LeaseGrant:
        """:meth:`_lease`, timed: how long a node waited for the leases it got (the lease
        wake-up histogram of ``/metrics``)."""
        t0 = time.perf_counter()
        grant = await self._lease(req)
        if grant.leases:
            self.lease_wait.observe(time.perf_counter() - t0)
        return grant

    async def _lease(self, req: LeaseRequest) -> LeaseGrant:
        """Grant what the node may take now; with ``req.wait_s``, wait for work if there is none.

        A request that comes back empty parks here (outside any transaction) until an event that
        may have created work for it, then is re-served by :meth:`_dispatch_leases` together with
        every other parked request, oldest first, in one transaction. It is answered as soon as it
        gets leases or the run is done, else with its latest empty answer when ``wait_s`` runs out.
        """
        generation = self._generation
        # Shielded: a client that hangs up (HangUpWatch cancels this handler) must not leave
        # behind leases the store operation grants after the cancel; they are returned.
        attempt = asyncio.ensure_future(
            self.store.run(lambda tx: leasing.serve(self.ctx, tx, [req]))
        )
        try:
            (outcome,), done_at = await asyncio.shield(attempt)
        except asyncio.CancelledError:
            attempt.add_done_callback(
                lambda t: (
                    None if t.cancelled() or t.exception() else self._return(req, t.result()[0][0])
                )
            )
            raise
        if isinstance(outcome, BaseException):
            raise outcome
        if outcome.leases:
            self._share_grant(req, outcome)
        if (
            outcome.leases
            or outcome.done
            or req.wait_s <= 0
            or self._lease_kick is None
            # it must load newer weights before it may work: tell it now
            or _held_back(self.config, self.ctx.mode, req, outcome.latest_versions)
        ):
            return _answer(self.config, self.ctx.mode, req, outcome)
        loop = asyncio.get_running_loop()
        waiter = _LeaseWaiter(req, loop.create_future(), outcome)
        self._lease_waiters[id(waiter)] = waiter
        self._wake_at(done_at)
        if self._generation != generation:  # work may have appeared since the attempt began
            self._lease_kick.set()
        try:
            try:
                outcome = await asyncio.wait_for(asyncio.shield(waiter.fut), timeout=req.wait_s)
                return _answer(self.config, self.ctx.mode, req, outcome)
            except TimeoutError:
                if not waiter.in_pass:
                    return _answer(self.config, self.ctx.mode, req, waiter.last)
                waiter.expired = True  # the pass under way answers it, leases or not
                return _answer(self.config, self.ctx.mode, req, await waiter.fut)
        except asyncio.CancelledError:
            # the client hung up: a grant it got but will never read goes back at once (one a
            # pass makes after this is returned by the pass, the waiter being gone)
            if waiter.fut.done() and not waiter.fut.cancelled() and not waiter.fut.exception():
                self._return(req, waiter.fut.result())
            raise
        finally:
            self._lease_waiters.pop(id(waiter), None)

    def _end_parked(self, node_ids: list[str]) -> None:
        """Answer the parked requests of nodes that left with the error a pass would give them.

        Called after the commit that marked them left: a dispatch pass does not read the node of
        every parked request (:func:`.leasing.serve`), so it would not notice."""
        self._live_nodes.difference_update(node_ids)
        if not node_ids or not self._lease_waiters:
            return
        gone = set(node_ids)
        for w in list(self._lease_waiters.values()):
            if w.req.node_id in gone and not w.fut.done():
                try:
                    leasing.check_node(w.req.node_id, "left")
                except Exception as exc:  # noqa: BLE001 - the error the node is answered with
                    w.fut.set_exception(exc)

    def _share_grant(self, req: LeaseRequest, grant: LeaseGrant) -> None:
        """A request granted leases in its own transaction hands them to a request with the same
        node and idempotency key parked meanwhile (its original): the pass that would have read
        the stored grant does not read every parked request's (:func:`.leasing.serve`)."""
        if not req.idempotency_key or not self._lease_waiters:
            return
        for w in list(self._lease_waiters.values()):
            if (
                w.req.idempotency_key == req.idempotency_key
                and w.req.node_id == req.node_id
                and not w.fut.done()
            ):
                w.fut.set_result(grant)

    def _return(self, req: LeaseRequest, grant: object) -> None:
        """Give back the leases of a grant whose client is gone (released, key forgotten)."""
        if not isinstance(grant, LeaseGrant) or not grant.leases:
            return
        lease_ids = [lease.id for lease in grant.leases]

        async def give_back() -> None:
            try:
                n = await self.store.run(
                    lambda tx: leasing.return_grant(self.ctx, tx, req, lease_ids)
                )
                log.info("node %s hung up: %d granted lease(s) back in the queue", req.node_id, n)
            except Exception as exc:  # the leases then expire as before
                log.warning("could not return the leases of a hung-up request: %s", exc)

        task = asyncio.ensure_future(give_back())
        self._returns.add(task)
        task.add_done_callback(self._returns.discard)

    async def _dispatch_leases(self) -> None:
        """Re-serve parked lease requests after each signal, all in one store operation.

        One pass at a time: signals raised while a pass runs coalesce into the next one, and a pass
        right after another waits out :func:`_throttle`. Granted and errored requests are answered;
        the rest stay parked, in their original order (first come, first served)."""
        loop = asyncio.get_running_loop()
        last_start = last_end = 0.0
        while True:
            await self._lease_kick.wait()
            pause = _throttle(loop, last_start, last_end)
            if pause > 0:
                await asyncio.sleep(pause)
            self._lease_kick.clear()
            waiters = [w for w in self._lease_waiters.values() if not w.fut.done()]
            if not waiters:
                continue
            reqs = [w.req for w in waiters]
            for w in waiters:
                w.in_pass = True
            last_start = loop.time()
            try:
                outcomes, done_at = await self.store.run(
                    lambda tx, reqs=reqs: leasing.serve(self.ctx, tx, reqs, touch=False)
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the store failed: every parked request gets the error
                outcomes, done_at = [exc] * len(waiters), None
            finally:
                last_end = loop.time()
                for w in waiters:
                    w.in_pass = False
            for w, outcome in zip(waiters, outcomes, strict=True):
                if w.fut.done() or (id(w) not in self._lease_waiters and not w.expired):
                    # gone (its client hung up and its handler was cancelled): what this pass
                    # granted it goes back to the queue at once
                    if not w.fut.done():
                        self._return(w.req, outcome)
                    continue
                if isinstance(outcome, BaseException):
                    w.fut.set_exception(outcome)
                elif outcome.leases or outcome.done or w.expired or self._tell_news(w, outcome):
                    w.fut.set_result(outcome)
                else:
                    w.last = outcome
            self._wake_at(done_at)

    def _tell_news(self, waiter: _LeaseWaiter, outcome: LeaseGrant) -> bool:
        """Answer a parked request to pass on version news (:func:`_news`)?

        Always when the node's work is held back until it loads them. Otherwise only while the
        pool is within its heartbeat budget: every version would end every parked request at
        once, and each comes straight back, so a pool of thousands of parked nodes sent thousands
        of requests in a burst per version (bench/dataflow_scale.py). A larger pool hears
        of versions from its heartbeats, which are paced and spread over the interval."""
        if not _news(waiter, outcome):
            return False
        if not self.ctx.heartbeat_s or self.ctx.heartbeat_s <= self.config.heartbeat_interval_s:
            return True
        return _held_back(self.config, self.ctx.mode, waiter.req, outcome.latest_versions)

    async def release(self, req: LeaseRelease) -> Ack:
        # released tasks wake parked lease requests through ctx.wake (as do deregistrations)
        n = await self.store.run(lambda tx: leasing.release(self.ctx, tx, req))
        return Ack(detail=f"{n} lease(s) returned to the queue")

    async def push(self, req: TrajectoryPush, packed: dict | None = None) -> PushResult:
        """Ingest a push. A refusal for what conflicts with what the service issued
        (``accepted=false``) ends the lease (:func:`.ingest.end_refused_lease`) and is counted in
        ``/status.refused`` as ``409 POST /trajectories: FIELD`` (4xx answers are counted by the
        HTTP layer)."""
        # a push that completed its task wakes the long polls through ctx.wake
        refused: dict = {}
        result = await self.store.run(lambda tx: ingest.push(self.ctx, tx, req, packed, refused))
        if "field" in refused:
            self.refusals.count(409, "POST", "/trajectories", [refused["field"]])
        self.refusals.note(DISCARDED_SAVES, refused.get("discarded_saves", 0))
        return result

    async def save_partials(self, req: PartialPush) -> PartialResult:
        return await self.store.run(lambda tx: resuming.save(self.ctx, tx, req))

    # -- batches ------------------------------------------------------------------------------
    async def next_batch(self, req: BatchRequest) -> dict:
        """A BatchReply wire dict; long-polls up to ``req.wait_s`` for enough groups."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + req.wait_s
        while True:
            changed = self._changed
            start = loop.time()
            result = await self.store.run(lambda tx: batching.next_batch(self.ctx, tx, req))
            if result is not None:
                if result.get("batch") is not None:
                    self._signal()  # its groups left the buffer: backpressure may let nodes lease
                return result
            end = loop.time()
            remaining = deadline - end
            if remaining <= 0 or changed is None:
                return batching.reply(reason="not enough groups yet; ask again")
            try:
                await asyncio.wait_for(changed.wait(), timeout=remaining)
            except TimeoutError:
                continue
            pause = min(_throttle(loop, start, end), deadline - loop.time())
            if pause > 0:
                await asyncio.sleep(pause)

    async def ack(self, batch_id: str, req: BatchAck) -> Ack:
        result = await self.store.run(lambda tx: batching.ack(self.ctx, tx, batch_id, req))
        self._news_generation += 1  # the run may be done now
        self._signal()
        return result

    # -- versions and evaluations ------------------------------------------------------------
    async def announce(self, wv: WeightVersion) -> Ack:
        def op(tx: Tx) -> Ack:
            if wv.policy not in self.config.recipe.policies:
                raise Invalid(
                    f"unknown policy {wv.policy!r}; recipe policies: "
                    f"{sorted(self.config.recipe.policies)}",
                    "policy",
                )
            # The trainer owns its policy's version stream: one that restarted from an older
            # checkpoint announces that version again, and the versions after it no longer exist;
            # the steps after it are trained again on the same batches (see timeline.rewind).
            storage.versions.delete_after(tx, wv.policy, wv.version)
            undone = timeline.rewind(self.ctx, tx, wv.policy, wv.version)
            timeline.reannounced(self.ctx, tx, wv.policy, wv.version, wv.digest)
            # A restarted trainer announces its checkpoint's version again: the same weights
            # keep their first announcement time (evaluations of them stay valid).
            storage.versions.record(tx, wv, self.ctx.now())
            self.ctx.facts = None  # read again: the announcement may carry new model facts
            self.ctx.advance_mode(tx)
            latest = storage.versions.latest_versions(tx)[wv.policy]
            rewound = f"; {undone} later step(s) will be trained again" if undone else ""
            return Ack(
                detail=f"{wv.policy} version {wv.version} recorded (latest {latest}){rewound}"
            )

        result = await self.store.run(op)
        self._news_generation += 1
        self._signal()
        return result

    async def stop_run(self, req: RunStop) -> Ack:
        """End the run: every done check answers yes from now on (trainers get ``done``, nodes
        ``stop``/``done``, ``wait_done`` returns), so each service leaves the way it leaves at
        the end of a run; durable, so a restarted service stays stopped."""
        first = await self.store.run(lambda tx: state.stop(tx, req.reason))
        self._news_generation += 1
        self._signal()  # parked lease, batch and status requests answer now
        if first:
            log.warning("run stopped: %s", req.reason)
            return Ack(detail=f"run stopped: {req.reason}")
        return Ack(detail="the run was already stopped")

    async def latest_weights(self) -> dict[str, WeightVersion]:
        return await self.store.run(storage.versions.latest_weights)

    async def request_evaluation(self, req: EvaluationRequest) -> EvaluationResult:
        result = await self.store.run(lambda tx: evaluating.request(self.ctx, tx, req))
        self._signal()  # new evaluation tasks
        return result

    async def evaluations(self, policy: str | None = None) -> list[EvaluationResult]:
        return await self.store.run(lambda tx: evaluating.list_all(tx, policy))

    async def evaluation(self, eval_id: str) -> EvaluationResult:
        return await self.store.run(lambda tx: evaluating.get(tx, eval_id))

    async def wait_done(self, wait_s: float) -> bool:
        """Long poll for the end of the run: True as soon as nodes may leave, False after wait_s.

        Trainers keep serving their weights until then and the launcher declares the run over
        then, so both wait here instead of polling ``/status`` on a timer. The run ends through an
        ack or push (they signal) or, after those, when the done grace period runs out (a timed
        wait to exactly then)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(max(wait_s, 0.0), 600.0)
        while True:
            changed = self._changed
            done, at = await self.store.run(
                lambda tx: (leasing.nodes_done(self.ctx, tx), leasing.done_at(self.ctx, tx))
            )
            remaining = deadline - loop.time()
            if done or remaining <= 0 or changed is None:
                return done
            if at is not None:  # 10 ms floor: no tight loop should the clock disagree
                remaining = min(remaining, max(0.01, at - self.ctx.now() + 0.001))
            try:
                await asyncio.wait_for(changed.wait(), timeout=remaining)
            except TimeoutError:
                pass

    async def transcripts(self, step: int | None, failed: bool | None, limit: int):
        """The kept transcripts (see :mod:`.transcripts`), newest step first."""
        return await self.store.run(lambda tx: transcripts_mod.read(tx, step, failed, limit))

    async def status(self) -> status_mod.DataflowStatus:
        doc = await self.store.run(lambda tx: status_mod.build(self.ctx, tx))
        doc.refused = self.refusals.snapshot()
        doc.store = {
            "path": str(self.store.path),
            "commits": self.store.commits,
            "ops": self.store.ops,
            "synchronous": self.store.synchronous,
            "op_seconds": round(self.store.op_seconds, 4),
            "commit_seconds": round(self.store.commit_seconds, 4),
            "max_commit_seconds": round(self.store.max_commit_seconds, 4),
            "flushes": self.store.flushes,
            "flush_seconds": round(self.store.flush_seconds, 4),
        }
        return doc
