"""The rollout node's long-polling lease loop against the real dataflow service on loopback.

The node runs in-process (its own event loop in a thread) with a scripted engine and workflow, so
a test controls exactly when work appears, when weights arrive and when a group finishes. Bounds
are generous: "answered well before lease_wait_s ran out" is the behaviour under test.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dataflow"))

from dataflow_helpers import TOKEN, ThreadedService, episode, make_recipe  # noqa: E402

from astraflow.dataflow.storage import history  # noqa: E402
from astraflow.protocol.client import DataflowClient, SyncDataflowClient  # noqa: E402
from astraflow.rollout.engines.base import SamplingParams  # noqa: E402
from astraflow.rollout.node import NodeSettings, RolloutNode  # noqa: E402
from astraflow.rollout.workflows import RolePolicy  # noqa: E402
from astraflow.rollout.workflows.base import WorkflowSpec  # noqa: E402

LEASE_WAIT_S = 10.0
PROMPT_S = 4.0


class ScriptedEngine:
    """Holds a version; loads whatever update it is given."""

    def __init__(self, version: int = 0) -> None:
        self.version = version

    async def load_weights(self, update) -> None:
        self.version = update.version


class NodeThread:
    """A real :class:`RolloutNode` on its own event loop in a background thread."""

    def __init__(
        self, url: str, *, version: int = 0, concurrency: int = 2, group_size=None, fetcher=None
    ):
        self.url = url
        self.group_size = group_size
        self.running = 0  # episodes in flight on the node now, and the most seen at once
        self.most_running = 0
        self.engine = ScriptedEngine(version)
        self.gate = threading.Event()  # each episode waits for it (set: episodes run through)
        self.gate.set()
        self.fetcher = fetcher
        self.concurrency = concurrency
        self.node: RolloutNode | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, daemon=True)

    async def _workflow(self, task, by_role, make_env, **kwargs):
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            while not self.gate.is_set():
                await asyncio.sleep(0.02)
            return episode(task.id, reward=float(len(task.id) % 2), version=self.engine.version)
        finally:
            self.running -= 1

    def _main(self) -> None:
        async def run():
            self.loop = asyncio.get_running_loop()
            spec = WorkflowSpec("single_agent", self._workflow, ("agent",))
            async with DataflowClient(self.url, TOKEN, retries=1) as client:
                self.node = RolloutNode(
                    client,
                    {"policy": RolePolicy("policy", self.engine, SamplingParams())},
                    lambda _name: spec,
                    lambda env_id, kw: None,
                    NodeSettings(
                        concurrency=self.concurrency,
                        group_size=self.group_size,
                        roles={"agent": "policy"},
                        lease_wait_s=LEASE_WAIT_S,
                        drain_timeout_s=5.0,
                    ),
                    self.fetcher,
                )
                await self.node.run()

        try:
            asyncio.run(run())
        except BaseException as exc:  # surfaced by stop()
            self.error = exc

    def start(self) -> NodeThread:
        self.thread.start()
        return self

    def node_id(self, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while self.node is None or self.node.node_id is None:
            assert time.monotonic() < deadline, "node did not register"
            time.sleep(0.01)
        return self.node.node_id

    def stop(self) -> None:
        self.gate.set()
        if self.thread.is_alive() and self.loop is not None and self.node is not None:
            self.loop.call_soon_threadsafe(self.node.request_stop)
        self.thread.join(30)
        assert not self.thread.is_alive(), "node did not stop"
        if self.error is not None:
            raise self.error


def _parked(svc, node_id: str, versions: dict[str, int] | None = None, timeout: float = 30):
    """Wait until the node's lease request is parked at the service (with these versions)."""
    deadline = time.monotonic() + timeout
    while True:
        for w in list(svc.service._lease_waiters.values()):
            if w.req.node_id == node_id and (versions is None or w.req.versions == versions):
                assert w.req.wait_s == LEASE_WAIT_S
                return w
        assert time.monotonic() < deadline, "the node's lease request never parked"
        time.sleep(0.01)


def _leases(svc, node_id: str) -> list[history.LeaseRecord]:
    return [x for x in svc.service.store.call(history.leases) if x.node_id == node_id]


def _task(svc, task_id: str) -> history.TaskRecord:
    return next(t for t in svc.service.store.call(history.tasks) if t.id == task_id)


def _until(what: str, check, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} not within {timeout:.1f}s"
        time.sleep(0.01)


def _finite(tmp_path, n: int, group_size: int = 2, **dataflow):
    return make_recipe(
        tmp_path,
        policies={"policy": {"model": "builtin:tiny-arith", "trainable": False}},
        tasks={"group_size": group_size, "epochs": 1, "sets": [{"name": "arith", "limit": n}]},
        dataflow={"lease_timeout_s": 30.0, "buffer_steps": 0, "heartbeat_interval_s": 0.3,
                  **dataflow},
    )  # fmt: skip


def test_parked_node_takes_released_work_at_once_and_leaves_when_done(tmp_path):
    recipe = _finite(tmp_path, 1)
    svc = ThreadedService(recipe, tmp_path / "df.db", config_kwargs={"done_grace_s": 0.2})
    with svc, SyncDataflowClient(svc.url, TOKEN, retries=0) as c:
        other = c.register(policies={"policy": 0}).node_id
        (taken,) = c.lease(node_id=other, max_tasks=5, versions={"policy": 0}).leases
        node = NodeThread(svc.url).start()
        try:
            nid = node.node_id()
            _parked(svc, nid)
            t0 = time.monotonic()
            c.release(other, [taken.id])
            _until("the node leasing the released task", lambda: _leases(svc, nid), PROMPT_S)
            assert time.monotonic() - t0 < PROMPT_S
            # it runs the group, pushes it, and the run is over: the parked request that follows
            # is answered "done" and the node leaves by itself
            node.thread.join(LEASE_WAIT_S)
            assert not node.thread.is_alive(), "the node did not leave when the run was done"
            assert _task(svc, taken.task.id).state == "done"
        finally:
            node.stop()


def test_a_node_behind_on_weights_asks_again_as_soon_as_they_load(tmp_path):
    """A node too stale for admission control is answered at once (not parked with versions it
    is about to replace) and asks again the moment its weights loop has the new version."""
    arrived = threading.Event()

    def fetch(policy, location, have, want):
        arrived.wait(30)  # the weights "arrive" when the test says so
        return SimpleNamespace(version=want, delta=None)

    recipe = make_recipe(tmp_path, dataflow={"max_lag": 1, "buffer_steps": 0})
    with (
        ThreadedService(recipe, tmp_path / "df.db") as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=0) as c,
    ):
        c.announce_version(policy="policy", version=2, location="http://w/2", digest="d")
        node = NodeThread(svc.url, fetcher=fetch).start()
        try:
            node.gate.clear()  # keep granted groups running: the test only checks the lease
            nid = node.node_id()
            time.sleep(0.5)  # the fetch is held back: the node holds version 0, latest is 2
            assert _leases(svc, nid) == []  # too stale for admission control (max_lag 1)
            assert not [w for w in svc.service._lease_waiters.values() if w.req.node_id == nid]
            t0 = time.monotonic()
            arrived.set()
            rows = _until("a lease with the new weights", lambda: _leases(svc, nid), PROMPT_S)
            assert time.monotonic() - t0 < PROMPT_S
            assert all(r.versions.get("policy") == 2 for r in rows), rows
        finally:
            node.stop()


def test_heartbeats_keep_leases_alive_while_a_lease_request_is_parked(tmp_path):
    # one task: the node takes it, parks a request for more, and its group runs past the
    # lease timeout; only heartbeats (concurrent with the parked request) keep the lease
    recipe = _finite(tmp_path, 1, lease_timeout_s=1.0)
    with ThreadedService(recipe, tmp_path / "df.db") as svc:
        node = NodeThread(svc.url, concurrency=4)
        node.gate.clear()
        node.start()
        try:
            nid = node.node_id()
            _parked(svc, nid)
            (lease,) = _leases(svc, nid)
            time.sleep(3.0)  # three lease timeouts
            assert _leases(svc, nid)[0].state == "active"
            node.gate.set()
            _until(
                "the group to land under its original lease",
                lambda: _task(svc, lease.task_id).winner == lease.id,
                PROMPT_S,
            )
        finally:
            node.stop()


def _active_leases(svc, node_id: str) -> int:
    return sum(1 for r in _leases(svc, node_id) if r.state == "active")


@pytest.mark.parametrize(
    ("concurrency", "group_size", "expected"),
    [(10, 4, 8), (8, 4, 8), (3, 4, 4)],  # a group larger than the node runs alone
)
def test_concurrency_counts_episodes_in_flight(tmp_path, concurrency, group_size, expected):
    """``rollout.concurrency`` is episodes in flight per node: the node leases a group only while
    its busy episodes plus the group fit, and the service never grants more episodes than the
    request's free slots (it used to grant ``concurrency`` groups: 40 episodes at 10 x 4)."""
    recipe = _finite(tmp_path, 12, group_size=group_size)
    svc = ThreadedService(recipe, tmp_path / "df.db", config_kwargs={"done_grace_s": 0.2})
    with svc:
        node = NodeThread(svc.url, concurrency=concurrency)  # learns group_size at registration
        node.gate.clear()  # episodes hold their slots until the gate opens
        node.start()
        try:
            nid = node.node_id()
            _until("the node filling its slots", lambda: node.running >= expected, PROMPT_S)
            time.sleep(0.5)  # room for a wrong extra lease to show up
            assert node.running == expected
            assert _active_leases(svc, nid) == expected // group_size
            node.gate.set()  # the rest of the run: every task, never more in flight
            node.thread.join(60)
            assert not node.thread.is_alive(), "the node did not finish the run"
            assert node.most_running == expected
            assert len(_leases(svc, nid)) == 12
        finally:
            node.stop()
