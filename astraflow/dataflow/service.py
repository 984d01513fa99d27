"""The dataflow service's operations, independent of HTTP.

Each public coroutine runs one operation as a transaction on the store's writer thread (see
:mod:`astraflow.dataflow.store`) and returns only after the commit. Long polls (batch and lease
requests with ``wait_s``) wait outside any transaction for a signal raised by the operations that
can create what they wait for (pushes, acks, version announcements, released or expired leases,
evaluation requests), then try again.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

from astraflow.dataflow import (
    adaptive,
    batching,
    evaluations,
    ingest,
    leases,
    modes,
    storage,
    timeline,
)
from astraflow.dataflow import status as status_mod
from astraflow.dataflow.config import ServiceConfig
from astraflow.dataflow.context import Context
from astraflow.dataflow.errors import Invalid
from astraflow.dataflow.feeder import TaskFeeder
from astraflow.dataflow.metrics import MetricsLog
from astraflow.dataflow.modes import RunMode
from astraflow.dataflow.policies import Pipeline, PolicyRegistry
from astraflow.dataflow.store import Store, Tx
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
    PushResult,
    TrajectoryPush,
    WeightVersion,
    new_id,
)

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _LeaseWaiter:
    """A parked lease request: answered by the lease dispatcher (see :meth:`DataflowService.lease`)."""

    req: LeaseRequest
    fut: asyncio.Future
    #: the latest empty answer, returned when the wait runs out
    last: LeaseGrant
    #: a dispatch pass that includes this request is under way
    in_pass: bool = False
    #: the wait ran out during such a pass: the pass answers it whatever it finds
    expired: bool = False


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
        registry: PolicyRegistry | None = None,
        synchronous: str = "FULL",
        task_loader=None,
    ) -> None:
        self.config = config
        pipeline = Pipeline.from_config(config.recipe.dataflow.policies, registry)
        if pipeline.adaptive:
            # adaptive weights act on tasks as they are enqueued: keep the pending window to about
            # one optimizer step so a changed weight shows within a step, not many steps later
            per_step = max(p.trainer.groups_per_step for p in config.recipe.policies.values())
            config.task_window = min(config.task_window, per_step)
        feeder = TaskFeeder(config, pipeline, loader=task_loader)
        self.ctx = Context(
            config,
            pipeline,
            feeder,
            MetricsLog(config.metrics_path),
            modes.for_run_mode(config.recipe.run.mode),
        )
        self.store = Store(store_path, synchronous=synchronous)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Event | None = None
        self._sweeper: asyncio.Task | None = None
        #: parked lease requests, oldest first (dicts keep insertion order)
        self._lease_waiters: dict[int, _LeaseWaiter] = {}
        self._lease_kick: asyncio.Event | None = None
        self._lease_dispatcher: asyncio.Task | None = None
        self._done_timer: asyncio.TimerHandle | None = None
        #: bumped by every signal: a request that saw no work re-checks if it moved meanwhile
        self._generation = 0
        self.store.call(self._init)

    def _init(self, tx: Tx) -> None:
        self.ctx.metrics.recover(tx)
        adaptive.load(self.ctx, tx)
        for key in self.ctx.feeder.sets:  # fail at startup on a bad task set, not later
            self.ctx.feeder.payloads(key)
        self.ctx.mode.start(self.ctx, tx)

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
        self.ctx.wake = None
        self.store.close()

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
        """Expire overdue leases every ``lease_timeout_s / 4`` (and prune old idempotency keys
        every 10 minutes), for as long as the service runs.

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
                    await self.store.run(lambda tx: storage.idempotency.prune(tx, self.ctx.now()))
                # expiry wakes parked lease requests through ctx.wake
                await self.store.run(lambda tx: leases.expire_overdue(self.ctx, tx))
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
    async def register(self, reg: NodeRegistration) -> NodeRegistered:
        def op(tx: Tx) -> NodeRegistered:
            now = self.ctx.now()
            if reg.replace and reg.name:
                silent_since = now - 2 * self.config.heartbeat_interval_s
                for old in storage.nodes.silent_named(tx, reg.name, silent_since):
                    leases.release_node(self.ctx, tx, old)
                    storage.nodes.mark_left(tx, old)
            node_id = new_id("node")
            storage.nodes.insert(tx, node_id, reg.model_dump_json(), reg.policies, now)
            return NodeRegistered(
                node_id=node_id,
                heartbeat_interval_s=self.config.heartbeat_interval_s,
                lease_timeout_s=self.config.lease_timeout_s,
                latest_versions=storage.versions.latest_versions(tx),
                max_lag=self.config.recipe.dataflow.max_lag,
            )

        result = await self.store.run(op)
        if reg.replace:
            self._signal()  # a replaced node's leases went back to the queue
        return result

    async def heartbeat(self, node_id: str, hb: Heartbeat) -> HeartbeatReply:
        return await self.store.run(lambda tx: leases.heartbeat(self.ctx, tx, node_id, hb))

    async def deregister(self, node_id: str) -> Ack:
        def op(tx: Tx) -> Ack:
            leases.touch_node(self.ctx, tx, node_id, None)
            n = leases.release_node(self.ctx, tx, node_id)
            storage.nodes.mark_left(tx, node_id)
            return Ack(detail=f"node left; {n} lease(s) returned to the queue")

        result = await self.store.run(op)
        self._signal()  # its leases went back to the queue; its own parked request gets a 404
        return result

    # -- leases and pushes --------------------------------------------------------------------
    async def lease(self, req: LeaseRequest) -> LeaseGrant:
        """Grant what the node may take now; with ``req.wait_s``, wait for work if there is none.

        A request that comes back empty parks here (outside any transaction) until an event that
        may have created work for it, then is re-served by :meth:`_dispatch_leases` together with
        every other parked request, oldest first, in one transaction. It is answered as soon as it
        gets leases or the run is done, else with its latest empty answer when ``wait_s`` runs out.
        """
        generation = self._generation
        (outcome,), done_at = await self.store.run(lambda tx: leases.serve(self.ctx, tx, [req]))
        if isinstance(outcome, BaseException):
            raise outcome
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
            except asyncio.TimeoutError:
                if not waiter.in_pass:
                    return _answer(self.config, self.ctx.mode, req, waiter.last)
                waiter.expired = True  # the pass under way answers it, leases or not
                return _answer(self.config, self.ctx.mode, req, await waiter.fut)
        finally:
            self._lease_waiters.pop(id(waiter), None)

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
                    lambda tx, reqs=reqs: leases.serve(self.ctx, tx, reqs, touch=False)
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
                    continue  # gone (its handler was cancelled); leases granted meanwhile are
                    # remembered under its idempotency key for a retry, or expire
                if isinstance(outcome, BaseException):
                    w.fut.set_exception(outcome)
                elif outcome.leases or outcome.done or w.expired or _news(w, outcome):
                    w.fut.set_result(outcome)
                else:
                    w.last = outcome
            self._wake_at(done_at)

    async def release(self, req: LeaseRelease) -> Ack:
        # released tasks wake parked lease requests through ctx.wake (as do deregistrations)
        n = await self.store.run(lambda tx: leases.release(self.ctx, tx, req))
        return Ack(detail=f"{n} lease(s) returned to the queue")

    async def push(self, req: TrajectoryPush, packed: dict | None = None) -> PushResult:
        # a push that completed its task wakes the long polls through ctx.wake
        return await self.store.run(lambda tx: ingest.push(self.ctx, tx, req, packed))

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
            except asyncio.TimeoutError:
                continue
            pause = min(_throttle(loop, start, end), deadline - loop.time())
            if pause > 0:
                await asyncio.sleep(pause)

    async def ack(self, batch_id: str, req: BatchAck) -> Ack:
        result = await self.store.run(lambda tx: batching.ack(self.ctx, tx, batch_id, req))
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
            self.ctx.mode.advance(self.ctx, tx)
            latest = storage.versions.latest_versions(tx)[wv.policy]
            rewound = f"; {undone} later step(s) will be trained again" if undone else ""
            return Ack(
                detail=f"{wv.policy} version {wv.version} recorded (latest {latest}){rewound}"
            )

        result = await self.store.run(op)
        self._signal()
        return result

    async def request_evaluation(self, req: EvaluationRequest) -> EvaluationResult:
        result = await self.store.run(lambda tx: evaluations.request(self.ctx, tx, req))
        self._signal()  # new evaluation tasks
        return result

    async def evaluations(self, policy: str | None = None) -> list[EvaluationResult]:
        return await self.store.run(lambda tx: evaluations.list_all(tx, policy))

    async def evaluation(self, eval_id: str) -> EvaluationResult:
        return await self.store.run(lambda tx: evaluations.get(tx, eval_id))

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
                lambda tx: (leases.nodes_done(self.ctx, tx), leases.done_at(self.ctx, tx))
            )
            remaining = deadline - loop.time()
            if done or remaining <= 0 or changed is None:
                return done
            if at is not None:  # 10 ms floor: no tight loop should the clock disagree
                remaining = min(remaining, max(0.01, at - self.ctx.now() + 0.001))
            try:
                await asyncio.wait_for(changed.wait(), timeout=remaining)
            except asyncio.TimeoutError:
                pass

    async def status(self) -> status_mod.DataflowStatus:
        doc = await self.store.run(lambda tx: status_mod.build(self.ctx, tx))
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
