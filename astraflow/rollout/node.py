"""The rollout node loop: register, heartbeat, lease, run workflow groups, push, keep weights current.

Every connection is outbound (to the dataflow service and to weight stores), so a node behind NAT in
another region works unchanged. A node owns nothing durable: if it dies, its leases expire and other
nodes redo the work (resuming the episodes it saved in flight, ``rollout.checkpoint_after_s``); the
dataflow service's first-finisher-wins rule keeps every task counted once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from astraflow.errors import AstraFlowError
from astraflow.protocol import (
    Episode,
    Heartbeat,
    Lease,
    LeaseRequest,
    NodeRegistration,
    PartialEpisode,
    PartialPush,
    Task,
    TrajectoryPush,
    new_id,
)
from astraflow.protocol.client import DataflowClient, NotFoundError, ServiceUnreachable
from astraflow.rollout.engines.base import EngineDeadError, WeightUpdate
from astraflow.rollout.env_runner import EnvCallTimeout, EnvRunner
from astraflow.rollout.workflows.base import EpisodeSaver, RolePolicy, WorkflowSpec
from astraflow.weights.delta import DeltaError

log = logging.getLogger("astraflow.rollout.node")


class NodeDeregistered(AstraFlowError, RuntimeError):
    """The service answered that this node is unknown or has left: the node must start again."""


class EngineFailure(AstraFlowError, RuntimeError):
    """The inference engine is broken; the node stops taking work so its leases expire."""


@dataclass
class NodeStats:
    episodes: int = 0
    errors: int = 0
    #: episodes cut because an env call ran past ``rollout.env_timeout_s`` (also in ``errors``)
    env_timeouts: int = 0
    pushes: int = 0
    tokens: int = 0
    weight_updates: int = 0
    #: seconds the latest weight update took (fetch from the store + load into the engine) and
    #: the sum over all of them; sent with each heartbeat so metrics.jsonl records sync times
    weight_fetch_s: float = 0.0
    weight_load_s: float = 0.0
    weight_sync_s_total: float = 0.0
    #: episodes in flight saved to the service (``POST /partials``, accepted)
    checkpoints: int = 0
    started: float = field(default_factory=time.time)

    def as_metrics(self) -> dict[str, float]:
        elapsed = max(time.time() - self.started, 1e-6)
        return {
            "episodes": self.episodes,
            "errors": self.errors,
            "env_timeouts": self.env_timeouts,
            "pushes": self.pushes,
            "episodes_per_s": self.episodes / elapsed,
            "tokens_per_s": self.tokens / elapsed,
            "weight_updates": self.weight_updates,
            "weight_fetch_s": self.weight_fetch_s,
            "weight_load_s": self.weight_load_s,
            "weight_sync_s": self.weight_fetch_s + self.weight_load_s,
            "weight_sync_s_mean": self.weight_sync_s_total / max(self.weight_updates, 1),
            "episode_saves": self.checkpoints,
        }


@dataclass
class NodeSettings:
    #: episodes in flight on this node (recipe ``rollout.concurrency``): the node leases a group
    #: only while its busy episodes plus the group's fit; one group larger than this runs alone
    concurrency: int = 16
    #: episodes per training task (recipe ``tasks.group_size``; None: as the service says at
    #: registration): the node asks for work only while a whole group fits its free slots
    #: (evaluation tasks, one episode each, fill in the rest)
    group_size: int | None = None
    name: str = ""
    region: str = "local"
    #: workflow kwargs from the recipe (max_turns, system prompt ...)
    workflow_kwargs: dict[str, Any] = field(default_factory=dict)
    #: role -> policy name (recipe.workflow.roles)
    roles: dict[str, str] = field(default_factory=dict)
    #: this node restarts a crashed one of the same name (see NodeRegistration.replace)
    replace: bool = False
    #: on SIGTERM: how long in-flight groups may run on before their leases are released
    #: (a second SIGTERM/SIGINT releases them at once)
    drain_timeout_s: float = 60.0
    #: long poll: how long a lease request may wait at the dataflow service for work before it is
    #: answered empty (and asked again at once); work that appears meanwhile is granted at once
    lease_wait_s: float = 10.0
    #: how long a push that fails at the network level is retried (same idempotency key, so it
    #: lands at most once); past this the lease is left to expire and another node redoes the task
    push_retry_s: float = 120.0
    #: threads running sync env calls at once (recipe ``rollout.env_workers``)
    env_workers: int = 32
    #: limit of one env call (recipe ``rollout.env_timeout_s``; None = unbounded)
    env_timeout_s: float | None = 120.0
    #: save an episode in flight (``POST /partials``) once it has run this long, then at most once
    #: per this many seconds, after a finished turn (recipe ``rollout.checkpoint_after_s``; None:
    #: never). Only workflows that can resume (``WorkflowSpec.resumable``) over envs that can save
    #: their state are saved; a lease carrying saved episodes is resumed whatever this says.
    checkpoint_after_s: float | None = None


class RolloutNode:
    """Runs until the dataflow service says the run is done or the node is asked to stop."""

    def __init__(
        self,
        client: DataflowClient,
        policies: Mapping[str, RolePolicy],
        workflows: Callable[[str], WorkflowSpec],
        make_env: Callable[[str, dict[str, Any]], Any] | EnvRunner,
        settings: NodeSettings,
        weight_fetcher: Callable[[str, str, int | None, int], WeightUpdate] | None = None,
    ):
        """``make_env(env_id, kwargs)`` builds an environment (the recipe's ``tasks.env_kwargs``
        are the factory's business, as in :func:`astraflow.rollout.main.run_node`);
        ``weight_fetcher(policy, location, have_version, want_version)`` returns the update that
        takes an engine from ``have_version`` (None: from nothing) to ``want_version``."""
        self.client = client
        self.policies = dict(policies)
        self.workflows = workflows
        # ``make_env`` is the plain (sync) env factory; workflows get the runner's async one, so
        # no env call ever runs on this loop (see astraflow/rollout/env_runner.py).
        self.env_runner = (
            make_env
            if isinstance(make_env, EnvRunner)
            else EnvRunner(make_env, workers=settings.env_workers, timeout_s=settings.env_timeout_s)
        )
        self.make_env = self.env_runner.make
        self.settings = settings
        self.weight_fetcher = weight_fetcher
        self.stats = NodeStats()
        self.node_id: str | None = None
        self.heartbeat_s = 2.0
        self.latest: dict[str, int] = {}
        self.locations: dict[str, str] = {}
        #: digest of each policy's latest version, as announced
        self.digests: dict[str, str] = {}
        #: digest of the weights each engine loaded from the store (None: the model's own)
        self._loaded: dict[str, str | None] = {}
        self._in_flight: dict[str, asyncio.Task] = {}
        #: leases whose group is generated and whose push is under way: a drain waits for these
        self._pushing: set[str] = set()
        self._busy_slots = 0
        self.group_size = settings.group_size or 1
        self._stopping = asyncio.Event()
        self._release_now = asyncio.Event()
        self._done = asyncio.Event()
        self._failure: BaseException | None = None
        self._weights_lock = asyncio.Lock()
        self._new_version = asyncio.Event()
        #: set when a lease's slots free up (the lease loop waits on it while every slot is busy)
        self._slot_freed = asyncio.Event()
        #: set when an engine loaded new weights (a parked lease request then carries old versions)
        self._weights_changed = asyncio.Event()

    # ---------------------------------------------------------------- lifecycle
    def versions(self) -> dict[str, int]:
        return {name: p.engine.version for name, p in self.policies.items()}

    def request_stop(self) -> None:
        """Graceful stop (SIGTERM): finish or release in-flight work, then deregister.

        A second request (another SIGTERM, or Ctrl-C twice) stops waiting: unfinished groups are
        released at once so other nodes can redo them without waiting for the lease deadline."""
        if self._stopping.is_set():
            self._release_now.set()
        self._stopping.set()

    async def run(self) -> NodeStats:
        reg = await self.client.register(
            NodeRegistration(
                name=self.settings.name,
                policies=self.versions(),
                concurrency=self.settings.concurrency,
                region=self.settings.region,
                engines={n: type(p.engine).__name__ for n, p in self.policies.items()},
                replace=self.settings.replace,
            )
        )
        self.node_id = reg.node_id
        self.heartbeat_s = reg.heartbeat_interval_s
        self.group_size = self.settings.group_size or reg.group_size or 1
        self.latest.update(reg.latest_versions)
        log.info("registered as %s (heartbeat %.1fs)", self.node_id, self.heartbeat_s)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.request_stop)
            except (NotImplementedError, RuntimeError):  # not main thread / platform
                pass
        heartbeat = asyncio.create_task(self._heartbeat_loop(), name="heartbeat")
        workers = [
            asyncio.create_task(self._lease_loop(), name="lease"),
            asyncio.create_task(self._weights_loop(), name="weights"),
        ]
        try:
            await self._wait_finished()
        finally:
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            if self._failure is not None:
                # A broken engine: stop heartbeating at once so the service sees the node as dead
                # and its leases expire; nothing in flight can finish on this engine anyway.
                heartbeat.cancel()
                await self._abandon_in_flight()
            else:
                # Heartbeats go on while draining, so the leases being finished stay renewed.
                await self._drain()
                heartbeat.cancel()
            await asyncio.gather(heartbeat, return_exceptions=True)
            self.env_runner.shutdown()
            if self._failure is None:
                try:
                    await self.client.deregister(self.node_id)
                    log.info("deregistered %s", self.node_id)
                except Exception as exc:  # the service may already be gone at the end of a run
                    log.info("deregister failed: %s", exc)
        if self._failure is not None:
            raise self._failure
        return self.stats

    async def _wait_finished(self) -> None:
        stop = asyncio.create_task(self._stopping.wait())
        done = asyncio.create_task(self._done.wait())
        await asyncio.wait({stop, done}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        done.cancel()

    async def _drain(self) -> None:
        """Finish in-flight groups within the drain timeout; release what is left.

        While draining, every episode of a resumable workflow saves each turn it finishes
        (``EpisodeSaver``'s ``force``), so what the timeout cuts is handed back at its last turn:
        the node that takes the task over resumes it there (``rollout.checkpoint_after_s`` only
        sets how often episodes are saved while the node is not draining).

        Groups already being pushed are always awaited: cancelling a push whose request may have
        landed would leave the node unsure whether its episodes were taken."""
        if not self._in_flight:
            return
        log.info(
            "draining %d in-flight lease(s) (up to %.1fs)",
            len(self._in_flight),
            self.settings.drain_timeout_s,
        )
        pending = set(self._in_flight.values())
        release_now = asyncio.create_task(self._release_now.wait())
        deadline = time.monotonic() + self.settings.drain_timeout_s
        try:
            while pending and not self._release_now.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                _, pending = await asyncio.wait(
                    pending | {release_now}, timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
                pending.discard(release_now)
        finally:
            release_now.cancel()
        running = {lid: t for lid, t in self._in_flight.items() if lid not in self._pushing}
        for t in running.values():
            t.cancel()
        await asyncio.gather(*running.values(), return_exceptions=True)
        # pushes under way finish (the client's own retries bound them)
        await asyncio.gather(*self._in_flight.values(), return_exceptions=True)
        if running:
            try:
                n = await self.client.release(self.node_id, list(running))
                log.info("released %d unfinished lease(s)", getattr(n, "count", len(running)))
            except Exception as exc:
                log.warning("could not release %d leases: %s", len(running), exc)

    async def _abandon_in_flight(self) -> None:
        """Cancel everything in flight without pushing or releasing (the leases will expire)."""
        tasks = list(self._in_flight.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _node_gone(self, exc: NotFoundError) -> None:
        """The service no longer knows this node (deregistered, or a store without it): fail, so
        the process exits non-zero and its supervisor starts a fresh node that registers again,
        instead of a live process that never gets work."""
        if "node_id" in exc.fields:
            self._fail(NodeDeregistered(f"node {self.node_id} was deregistered: {exc.detail}"))
        else:
            log.warning("request refused: %s", exc)

    def _fail(self, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = exc
            log.error("node failing: %s", exc)
        self._done.set()

    # ---------------------------------------------------------------- heartbeat + weights
    async def _heartbeat_loop(self) -> None:
        while True:
            try:
                reply = await self.client.heartbeat(
                    self.node_id,
                    Heartbeat(
                        versions=self.versions(),
                        in_flight=list(self._in_flight),
                        metrics=self.stats.as_metrics(),
                    ),
                )
                self._note_versions(
                    reply.latest_versions, reply.weight_locations, reply.weight_digests
                )
                self._drop_lost(reply.lost)
                if reply.heartbeat_interval_s:  # a larger pool is asked to heartbeat less often
                    self.heartbeat_s = reply.heartbeat_interval_s
                if reply.stop:
                    self._done.set()
            except asyncio.CancelledError:
                raise
            except NotFoundError as exc:
                self._node_gone(exc)
                return
            except Exception as exc:  # network trouble: keep trying, leases may expire meanwhile
                log.warning("heartbeat failed: %s", exc)
            await asyncio.sleep(self.heartbeat_s)

    def _drop_lost(self, lost: list[str]) -> None:
        """Stop work on leases the service no longer counts (superseded, released, or the task
        was completed by another node): their episodes would be rejected anyway."""
        for lease_id in lost or ():
            task = self._in_flight.get(lease_id)
            if task is not None and lease_id not in self._pushing:
                log.info("lease %s lost (task done elsewhere or lease superseded)", lease_id)
                task.cancel()

    def _note_versions(
        self,
        latest: dict[str, int],
        locations: dict[str, str] | None = None,
        digests: dict[str, str] | None = None,
    ) -> None:
        """Record announced versions; wake the weight loop when a served policy fell behind."""
        self.latest.update(latest)
        self.locations.update(locations or {})
        self.digests.update(digests or {})
        # older than held: the trainer restarted from a checkpoint and this policy rewound;
        # same number, other digest: it rewound and was retrained while this node was away
        if any(
            self.latest.get(n, 0) != p.engine.version or self._stale(n)
            for n, p in self.policies.items()
        ):
            self._new_version.set()

    def _stale(self, name: str) -> bool:
        """The engine holds the latest version's number but not its weights (another digest)."""
        loaded, announced = self._loaded.get(name), self.digests.get(name)
        return (
            loaded is not None
            and announced is not None
            and loaded != announced
            and self.policies[name].engine.version == self.latest.get(name)
        )

    async def _weights_loop(self) -> None:
        """Fetch and apply new weights as soon as they are announced (between generations)."""
        while True:
            await self._new_version.wait()
            self._new_version.clear()
            try:
                await self._sync_weights()
            except asyncio.CancelledError:
                raise
            except EngineFailure as exc:
                self._fail(exc)
                return
            except (
                Exception
            ) as exc:  # store unreachable or transfer corrupt: retry on the next beat
                log.warning("weight sync failed: %s", exc)
                await asyncio.sleep(self.heartbeat_s)
                self._new_version.set()

    async def _sync_weights(self) -> None:
        """Bring every trainable policy's engine to the latest announced version."""
        if self.weight_fetcher is None:
            return
        async with self._weights_lock:
            for name, served in self.policies.items():
                want = self.latest.get(name, 0)
                have = served.engine.version
                stale = self._stale(name)
                if (want == have and not stale) or name not in self.locations:
                    continue
                if stale:
                    log.warning(
                        "policy %s: v%d here is not the announced v%d (digest %s, announced %s): "
                        "the timeline rewound meanwhile; reloading",
                        name, have, want, self._loaded.get(name), self.digests.get(name),
                    )  # fmt: skip
                t0 = time.perf_counter()
                # going back (a rewound timeline) takes the full snapshot: no delta leads there,
                # nor from weights that are not the store's version of that number
                update = await asyncio.to_thread(
                    self.weight_fetcher,
                    name,
                    self.locations[name],
                    have if want > have and not stale else None,
                    want,
                )
                fetched = time.perf_counter()
                try:
                    await served.engine.load_weights(update)
                except Exception as exc:
                    if isinstance(exc, DeltaError) and update.delta is not None:
                        # The engine's weights are not the delta's parent (e.g. a dtype cast):
                        # fall back to the full snapshot, which needs no parent.
                        log.warning(
                            "delta for %s v%d did not apply (%s); fetching full", name, want, exc
                        )
                        update = await asyncio.to_thread(
                            self.weight_fetcher, name, self.locations[name], None, want
                        )
                        await served.engine.load_weights(update)
                    else:
                        raise EngineFailure(
                            f"engine for {name} failed to load version {want}: {exc}"
                        ) from exc
                done = time.perf_counter()
                self._loaded[name] = getattr(update, "digest", None)
                self.stats.weight_updates += 1
                self.stats.weight_fetch_s = fetched - t0
                self.stats.weight_load_s = done - fetched
                self.stats.weight_sync_s_total += done - t0
                self._weights_changed.set()
                log.info(
                    "policy %s: v%d -> v%d (%s) in %.2fs (fetch %.3fs, load %.3fs)",
                    name,
                    have,
                    want,
                    "delta" if update.delta is not None else "full",
                    done - t0,
                    fetched - t0,
                    done - fetched,
                )

    # ---------------------------------------------------------------- leasing
    async def _lease_loop(self) -> None:
        """Ask for work with a long poll; start each granted group at once.

        The service does the waiting: a request parks there up to ``lease_wait_s`` and is answered
        the moment work this node may take appears, so an empty reply means nothing came up and
        the loop asks again straight away. While a whole group does not fit the free episode slots
        (``concurrency`` minus the episodes in flight) the loop waits for a group to finish; the
        request carries the free slots as ``max_episodes``, so the grant never exceeds them.
        A parked request is never cancelled from here: httpcore can leak a pooled connection when
        a request is cancelled mid-response, and a node that re-asked on every new version ran its
        pool dry. Instead the service answers a parked request at once when a version this node
        lacks is announced; the loop asks again at once, or, when the answer says its work is held
        back until it updates (admission control, a sync round), once the weights are loaded."""
        backoff = 0.0
        key: str | None = None
        while not self._stopping.is_set() and not self._done.is_set():
            free = self._free_slots()
            if free <= 0:
                self._slot_freed.clear()
                await self._slot_freed.wait()
                continue
            key = key or new_id("lease-req")
            self._weights_changed.clear()
            request = LeaseRequest(
                node_id=self.node_id,
                max_tasks=min(free, 4096),
                max_episodes=free,
                versions=self.versions(),
                idempotency_key=key,
                wait_s=self.settings.lease_wait_s,
            )
            asked, known = time.monotonic(), dict(self.latest)
            try:
                grant = await self.client.lease(request)
            except asyncio.CancelledError:
                raise
            except NotFoundError as exc:
                self._node_gone(exc)
                return
            except Exception as exc:  # network trouble: bounded backoff, same key
                backoff = min(max(0.5, backoff * 2), 10.0)
                log.warning("lease request failed: %s (retrying in %.1fs)", exc, backoff)
                await asyncio.sleep(backoff)
                continue
            key = None
            # news since the request was sent (a heartbeat may have brought it to self.latest
            # meanwhile; the service answered because the request had not seen it)
            news = any(known.get(n) != v for n, v in grant.latest_versions.items())
            self._note_versions(grant.latest_versions, grant.weight_locations, grant.weight_digests)
            if grant.done:
                # wait for in-flight work (each task leaves _in_flight when it ends), then leave
                while self._in_flight:
                    await asyncio.wait(list(self._in_flight.values()))
                self._done.set()
                return
            if not grant.leases:
                # An empty answer that says `update_first` holds this node's work back until it
                # loads the latest weights (admission control, a sync round, a rewind; the
                # weights loop is already fetching): ask again once they are loaded. An early
                # answer that brings version news is the service passing them on: ask again at
                # once (a node within max_lag works while its weights load). Any other early
                # answer (lease_wait_s = 0, or a service that does not long-poll) backs off
                # rather than spin. An answer that waited the whole lease_wait_s means nothing
                # came up: ask again at once.
                early = time.monotonic() - asked < min(1.0, self.settings.lease_wait_s / 2)
                behind = any(
                    grant.latest_versions.get(name, served.engine.version) != served.engine.version
                    for name, served in self.policies.items()
                )
                if grant.update_first and behind:
                    # bounded: a failing fetch must not stop the node from asking
                    try:
                        await asyncio.wait_for(
                            self._weights_changed.wait(), timeout=self.settings.lease_wait_s
                        )
                    except TimeoutError:
                        pass
                elif early and not news:
                    backoff = min(max(0.5, backoff * 2), 10.0)
                    await asyncio.sleep(backoff)
                continue
            backoff = 0.0
            for lease in grant.leases:
                slots = self._slots(lease.task)
                self._busy_slots += slots
                task = asyncio.create_task(self._run_lease(lease, slots), name=lease.id)
                self._in_flight[lease.id] = task

    def _free_slots(self) -> int:
        """Episode slots this node may lease now: 0 until a whole group fits. An idle node whose
        ``concurrency`` is below the group size may still take one group (it runs alone)."""
        concurrency, group = self.settings.concurrency, self.group_size
        if self._busy_slots == 0:
            return max(concurrency, group)
        free = concurrency - self._busy_slots
        return free if free >= group else 0

    def _slots(self, task: Task) -> int:
        return task.group_size

    async def _run_lease(self, lease: Lease, slots: int) -> None:
        try:
            episodes = await self._run_group(lease)
            # One push object per lease: every retry sends the same idempotency key and the same
            # episode ids, so the service stores the group at most once.
            push = TrajectoryPush(
                idempotency_key=f"push-{lease.id}",
                node_id=self.node_id,
                lease_id=lease.id,
                episodes=episodes,
            )
            self._pushing.add(lease.id)
            result = await self._push_with_retry(push)
            self.stats.pushes += 1
            if result.duplicate:
                log.info("push for %s had already landed (retry answered as duplicate)", lease.id)
            if not result.accepted:
                log.info("push for %s not accepted: %s", lease.id, result.reason)
        except asyncio.CancelledError:
            raise
        except EngineFailure as exc:
            self._fail(exc)
        except Exception as exc:
            log.exception("lease %s failed: %s", lease.id, exc)
        finally:
            self._busy_slots -= slots
            self._slot_freed.set()
            self._pushing.discard(lease.id)
            self._in_flight.pop(lease.id, None)

    async def _push_with_retry(self, push: TrajectoryPush):
        """The client retries a few times itself; a longer outage (a dataflow restart) is bridged
        here, with the SAME push, until ``push_retry_s`` runs out."""
        deadline = time.monotonic() + self.settings.push_retry_s
        delay = 0.5
        while True:
            try:
                return await self.client.push(push)
            except Exception as exc:
                if not isinstance(exc, ServiceUnreachable) or time.monotonic() >= deadline:
                    raise
                log.warning("push for %s failed (%s); retrying", push.lease_id, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _run_group(self, lease: Lease) -> list[Episode]:
        task = lease.task
        try:
            spec = self.workflows(task.workflow)
        except Exception as exc:
            # A task this node cannot run (a workflow name no registry knows) is pushed as failed
            # episodes, not dropped: the service counts and shows the error, and the launcher's
            # stall check stops a run whose every task fails this way, naming the message.
            return self._failed_group(task, exc)
        roles = self.settings.roles or {r: r for r in spec.roles}
        # a workflow without fixed roles (openai_agent) plays every role the recipe maps
        wanted = spec.roles or tuple(roles)
        missing = [r for r in wanted if roles.get(r) not in self.policies]
        if missing:
            raise RuntimeError(f"node serves no policy for roles {missing} of workflow {spec.name}")
        # Every generation of this group is scheduled by when the group started: an engine with
        # more episodes waiting than decode rows serves the oldest groups first, so groups finish
        # (and reach the trainer) in the order they were leased, not all together at the end.
        started = time.monotonic()
        by_role = {}
        for role in wanted:
            served = self.policies[roles[role]]
            sampling = replace(served.sampling, priority=started)
            by_role[role] = replace(served, sampling=sampling)
        kwargs = {**spec.defaults, **self.settings.workflow_kwargs}
        saved = trusted_saves(lease)
        if saved:
            log.info(
                "lease %s resumes %d saved episode(s) of task %s", lease.id, len(saved), task.id
            )
        playing = [task.group_size]  # episodes of the group not finished yet
        episodes = await asyncio.gather(
            *(
                self._one_episode(
                    spec, task, by_role, kwargs, self._saver(spec, lease, i, saved), playing
                )
                for i in range(task.group_size)
            )
        )
        return list(episodes)

    def _saver(
        self, spec: WorkflowSpec, lease: Lease, index: int, saved: dict[int, PartialEpisode]
    ) -> EpisodeSaver | None:
        """Episode ``index``'s link to its saved turns (None: the workflow cannot resume)."""
        if not spec.resumable:
            return None

        async def send(partial: PartialEpisode) -> bool:
            return await self._save_partial(lease.id, partial)

        return EpisodeSaver(
            index,
            saved.get(index),
            self.settings.checkpoint_after_s,
            send,
            force=self._stopping.is_set,  # a drain saves every finished turn (see _drain)
        )

    async def _save_partial(self, lease_id: str, partial: PartialEpisode) -> bool:
        """Hand one saved episode to the service; a failure costs only the save (never raises)."""
        try:
            result = await self.client.save_partials(
                PartialPush(node_id=self.node_id, lease_id=lease_id, partials=[partial])
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("saving episode %d of %s failed: %s", partial.index, lease_id, exc)
            return False
        if not result.accepted:
            log.info("save of episode %d of %s refused: %s", partial.index, lease_id, result.reason)
            return False
        self.stats.checkpoints += 1
        return True

    def _failed_group(self, task: Task, exc: Exception) -> list[Episode]:
        message = f"{type(exc).__name__}: {exc}"[:8000]
        self.stats.errors += task.group_size
        log.warning("task %s cannot run: %s", task.id, message)
        return [
            Episode(task_id=task.id, finish_reason="error", error=message)
            for _ in range(task.group_size)
        ]

    async def _one_episode(
        self,
        spec: WorkflowSpec,
        task: Task,
        by_role,
        kwargs,
        saver: EpisodeSaver | None = None,
        playing: list[int] | None = None,
    ) -> Episode:
        """One episode of a group; ``playing`` counts the group's episodes still running (a
        finished episode is saved whole only while others of its group still play: the last one
        is pushed with the group at once)."""
        # a saved finished episode never reaches here (:func:`trusted_saves` plays it again)
        try:
            if saver is not None:
                kwargs = {**kwargs, "saver": saver}
            episode = await spec.fn(task, by_role, self.make_env, **kwargs)
            self.stats.episodes += 1
            self.stats.tokens += sum(len(t.tokens) for t in episode.trajectories)
            if playing is not None:
                playing[0] -= 1
            if saver is not None and playing is not None and playing[0] > 0:
                await saver.finished(episode)
            return episode
        except EngineFailure:
            raise
        except EnvCallTimeout as exc:
            # Its own finish reason, so the dataflow service counts these drops apart from
            # crashes: a recipe whose limit is too tight shows up as "env_timeout", not noise.
            self.stats.errors += 1
            self.stats.env_timeouts += 1
            log.warning("episode of %s cut: %s", task.id, exc)
            return Episode(task_id=task.id, finish_reason="env_timeout", error=str(exc)[:8000])
        except Exception as exc:
            if _is_engine_dead(exc):
                raise EngineFailure(str(exc)) from exc
            self.stats.errors += 1
            log.warning("episode of %s failed: %s: %s", task.id, type(exc).__name__, exc)
            return Episode(
                task_id=task.id, finish_reason="error", error=f"{type(exc).__name__}: {exc}"[:8000]
            )


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))


def trusted_saves(lease: Lease) -> dict[int, PartialEpisode]:
    """The saved episodes of ``lease`` this node resumes, by episode index.

    Saves come from another node, and nodes are untrusted (issue 48, finding 3: forged saves
    resumed by an honest node trained forged rewards under the honest node's name). So:

    - a saved *finished* episode is never pushed as sent: its rewards, info and id were the
      saving node's word. The episode is played again here, so this node's env scores it
      (its id is this node's own, never one pushed before: finding 1);
    - an episode whose saved env state names a task payload other than the lease's
      (``env_state["task"]``, what every ``StateMixin`` env saves) is played from the start: it
      would have answered another question, or run another test plan, under this lease;
    - an index outside the group is ignored.

    What is resumed keeps its saved tokens, log-probs and versions (the service checked their
    vocabulary and versions), and the workflow credits the saved turns no reward
    (``workflows.single_agent.resume_saved``): every reward of the episode is computed by this
    node's env, for the turns it plays."""
    payload = _canonical(lease.task.payload)
    out: dict[int, PartialEpisode] = {}
    for partial in lease.partials:
        if partial.index >= lease.task.group_size or partial.index in out:
            continue
        if partial.finished is not None:
            log.info(
                "lease %s: saved finished episode %d is played again (its rewards are not taken "
                "on trust)",
                lease.id,
                partial.index,
            )
            continue
        state = partial.env_state
        if isinstance(state, dict) and "task" in state and _canonical(state["task"]) != payload:
            log.warning(
                "lease %s: saved episode %d refused: its env state is for another task payload "
                "than the lease's task %s; played from the start",
                lease.id,
                partial.index,
                lease.task.id,
            )
            continue
        out[partial.index] = partial
    return out


#: Exceptions that mean the engine itself is gone (not that one request was bad). Backends raise a
#: subclass of :class:`EngineDeadError` (the transformers engine's ``EngineClosedError``), so the
#: node matches by class without importing every backend (torch, vllm ...).
ENGINE_DEAD_ERRORS: tuple[type[BaseException], ...] = (EngineDeadError, EngineFailure)


def _is_engine_dead(exc: BaseException) -> bool:
    """True when ``exc`` (or an exception it was raised from) says the engine is gone."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ENGINE_DEAD_ERRORS):
            return True
        cur = cur.__cause__ or cur.__context__
    return False
