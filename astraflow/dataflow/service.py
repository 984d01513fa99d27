"""The dataflow service's operations, independent of HTTP.

Each public coroutine runs one operation as a transaction on the store's writer thread (see
:mod:`astraflow.dataflow.store`) and returns only after the commit. Long polls wait on a signal
raised after every commit, then try again.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from astraflow.dataflow import batching, evaluations, ingest, leases, state
from astraflow.dataflow import status as status_mod
from astraflow.dataflow.config import ServiceConfig
from astraflow.dataflow.context import Context
from astraflow.dataflow.errors import Invalid
from astraflow.dataflow.feeder import TaskFeeder
from astraflow.dataflow.metrics import MetricsLog
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

#: Minimum pause between two attempts of one long-polling batch request.
LONG_POLL_COALESCE_S = 0.05


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
        feeder = TaskFeeder(config, pipeline, loader=task_loader)
        self.ctx = Context(config, pipeline, feeder, MetricsLog(config.metrics_path))
        self.store = Store(store_path, synchronous=synchronous)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Event | None = None
        self._sweeper: asyncio.Task | None = None
        self.store.call(self._init)

    def _init(self, tx: Tx) -> None:
        self.ctx.metrics.recover(tx)
        for key in self.ctx.feeder.sets:  # fail at startup on a bad task set, not later
            self.ctx.feeder.payloads(key)
        if self.config.sync and tx.get_meta("round") is None:
            batching.start_round(self.ctx, tx, 0)

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        self._sweeper = asyncio.create_task(self._sweep())

    async def stop(self) -> None:
        if self._sweeper:
            self._sweeper.cancel()
            try:
                await self._sweeper
            except asyncio.CancelledError:
                pass
        self.store.close()

    def _signal(self) -> None:
        """Wake long-polling batch requests: something they wait for may have changed."""
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    async def _sweep(self) -> None:
        interval = max(0.05, min(1.0, self.config.lease_timeout_s / 4))
        last_prune = 0.0
        while True:
            await asyncio.sleep(interval)
            if self.ctx.now() - last_prune > 600:
                last_prune = self.ctx.now()
                try:
                    await self.store.run(lambda tx: state.prune_idempotency(tx, self.ctx.now()))
                except Exception:  # pruning is housekeeping; never stop the sweeper
                    pass
            try:
                if await self.store.run(lambda tx: leases.expire_overdue(self.ctx, tx)):
                    self._signal()
            except Exception:  # keep sweeping; the next lease call expires leases too
                pass

    # -- nodes --------------------------------------------------------------------------------
    async def register(self, reg: NodeRegistration) -> NodeRegistered:
        def op(tx: Tx) -> NodeRegistered:
            now = self.ctx.now()
            node_id = new_id("node")
            tx.execute(
                "INSERT INTO nodes(id, body, versions, state, registered_at, last_heartbeat) "
                "VALUES(?,?,?,'active',?,?)",
                (node_id, reg.model_dump_json(), json.dumps(reg.policies), now, now),
            )
            return NodeRegistered(
                node_id=node_id,
                heartbeat_interval_s=self.config.heartbeat_interval_s,
                lease_timeout_s=self.config.lease_timeout_s,
                latest_versions=state.latest_versions(tx),
                max_lag=self.config.recipe.dataflow.max_lag,
            )

        return await self.store.run(op)

    async def heartbeat(self, node_id: str, hb: Heartbeat) -> HeartbeatReply:
        return await self.store.run(lambda tx: leases.heartbeat(self.ctx, tx, node_id, hb))

    async def deregister(self, node_id: str) -> Ack:
        def op(tx: Tx) -> Ack:
            leases.touch_node(self.ctx, tx, node_id, None)
            n = leases.release_node(self.ctx, tx, node_id)
            tx.execute("UPDATE nodes SET state='left' WHERE id=?", (node_id,))
            return Ack(detail=f"node left; {n} lease(s) returned to the queue")

        return await self.store.run(op)

    # -- leases and pushes --------------------------------------------------------------------
    async def lease(self, req: LeaseRequest) -> LeaseGrant:
        return await self.store.run(lambda tx: leases.grant(self.ctx, tx, req))

    async def release(self, req: LeaseRelease) -> Ack:
        n = await self.store.run(lambda tx: leases.release(self.ctx, tx, req))
        return Ack(detail=f"{n} lease(s) returned to the queue")

    async def push(self, req: TrajectoryPush, packed: dict | None = None) -> PushResult:
        result = await self.store.run(lambda tx: ingest.push(self.ctx, tx, req, packed))
        self._signal()
        return result

    # -- batches ------------------------------------------------------------------------------
    async def next_batch(self, req: BatchRequest) -> dict:
        """A BatchReply wire dict; long-polls up to ``req.wait_s`` for enough groups."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + req.wait_s
        while True:
            changed = self._changed
            result = await self.store.run(lambda tx: batching.next_batch(self.ctx, tx, req))
            if result is not None:
                return result
            remaining = deadline - loop.time()
            if remaining <= 0 or changed is None:
                return batching.reply(reason="not enough groups yet; ask again")
            try:
                await asyncio.wait_for(changed.wait(), timeout=remaining)
            except asyncio.TimeoutError:
                continue
            # Coalesce wake-ups: under load every push signals, and a scan per push would cost
            # more than the pushes themselves.
            await asyncio.sleep(min(LONG_POLL_COALESCE_S, max(0.0, deadline - loop.time())))

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
            # checkpoint announces that version again, and the versions after it no longer exist.
            tx.execute("DELETE FROM versions WHERE policy=? AND version>?", (wv.policy, wv.version))
            tx.execute(
                "INSERT OR REPLACE INTO versions(policy, version, body, created_at) "
                "VALUES(?,?,?,?)",
                (wv.policy, wv.version, wv.model_dump_json(), self.ctx.now()),
            )
            if self.config.sync:
                batching.maybe_advance_round(self.ctx, tx)
            latest = state.latest_versions(tx)[wv.policy]
            return Ack(detail=f"{wv.policy} version {wv.version} recorded (latest {latest})")

        result = await self.store.run(op)
        self._signal()
        return result

    async def request_evaluation(self, req: EvaluationRequest) -> EvaluationResult:
        return await self.store.run(lambda tx: evaluations.request(self.ctx, tx, req))

    async def evaluations(self, policy: str | None = None) -> list[EvaluationResult]:
        return await self.store.run(lambda tx: evaluations.list_all(tx, policy))

    async def evaluation(self, eval_id: str) -> EvaluationResult:
        return await self.store.run(lambda tx: evaluations.get(tx, eval_id))

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
        }
        return doc
