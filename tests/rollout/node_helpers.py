"""Helpers for the rollout-node tests: a real dataflow service and real nodes as child processes,
a loopback TCP proxy that loses replies, and checks on the service's SQLite store (read through the dataflow's storage functions).

Everything listens on 127.0.0.1 and every process started here is stopped by PID.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from astraflow.dataflow.storage import history, store
from astraflow.protocol.client import SyncDataflowClient

T = TypeVar("T")

TOKEN = "node-test-token"
REPO = Path(__file__).resolve().parents[2]
GROUP_SIZE = 2


def recipe_toml(out: Path, sets: str, *, lease_timeout_s: float = 4.0) -> str:
    """A finite run: one pass over ``sets`` with a frozen policy, so the run is done exactly when
    every task is done (no trainer needed) and the task count is known in advance."""
    return f"""
[run]
name = "nodetest"
output_dir = "{out}"
max_steps = 1

[policies.policy]
model = "builtin:tiny-arith"
trainable = false
sampling = {{ temperature = 1.0, max_tokens = 6 }}

[tasks]
group_size = {GROUP_SIZE}
epochs = 1
sets = [{sets}]

[dataflow]
lease_timeout_s = {lease_timeout_s}
heartbeat_interval_s = 0.5

[rollout]
concurrency = 2
device = "cpu"
"""


def arith_recipe(out: Path, n_tasks: int) -> str:
    return recipe_toml(out, f'{{ name = "arith", split = "train", limit = {n_tasks} }}')


def multi_turn_recipe(
    out: Path, name: str, *, group: int, n_tasks: int, max_turns: int,
    checkpoint_after_s: float | None,
) -> str:  # fmt: skip
    """Multi-turn arithmetic episodes slowed by a fixed 0.4 s per env step, so a node can be
    stopped in the middle of them; no trainer reads the buffer (samples stay for the caller to
    read) and ``checkpoint_after_s`` (None: off) says whether the node saves episodes in flight."""
    checkpoint = "" if checkpoint_after_s is None else f"checkpoint_after_s = {checkpoint_after_s}"
    return f"""
[run]
name = "{name}"
output_dir = "{out}"
max_steps = 1000

[policies.policy]
model = "builtin:tiny-arith"
sampling = {{ temperature = 1.0, max_tokens = 8 }}

[tasks]
env = "astraflow/MathMultiTurn-v0"
group_size = {group}
epochs = 1
sets = [{{ name = "arith", split = "train", limit = {n_tasks} }}]

[tasks.env_latency]
distribution = "fixed"
value_s = 0.4
on = ["step"]

[workflow]
name = "single_agent"
roles = {{ agent = "policy" }}
max_turns = {max_turns}

[dataflow]
lease_timeout_s = 3.0
heartbeat_interval_s = 0.5
admission = "buffer"
buffer_steps = 0

[rollout]
concurrency = {group}
{checkpoint}
"""


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


class Proc:
    """A child process with its output in a log file; stopped by PID."""

    def __init__(self, cmd: list[str], log: Path) -> None:
        self.log_path = log
        self._log = open(log, "ab")  # noqa: SIM115 - closed in stop()/wait()
        self.proc = subprocess.Popen(
            cmd, cwd=REPO, env=_env(), stdout=self._log, stderr=subprocess.STDOUT
        )
        self.pid = self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.running():
            os.kill(self.pid, sig)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is not None:
                self._log.close()

    def stop(self) -> None:
        if self.running():
            os.kill(self.pid, signal.SIGCONT)  # a stopped process cannot handle SIGTERM
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait(timeout=20)
        self._log.close()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


class Dataflow:
    """``astraflow serve dataflow`` on a free loopback port, its SQLite store, and a client."""

    def __init__(self, workdir: Path, recipe_text: str) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.recipe = workdir / "recipe.toml"
        self.recipe.write_text(recipe_text)
        self.store = workdir / "dataflow.db"
        port_file = workdir / "port"
        self.proc = Proc(
            [sys.executable, "-m", "astraflow.cli.main", "serve", "dataflow", "--recipe", str(self.recipe),
             "--store", str(self.store), "--port-file", str(port_file), "--port", "0",
             "--token", TOKEN],
            workdir / "dataflow.log",
        )  # fmt: skip
        deadline = time.time() + 120
        while not port_file.exists():
            if not self.proc.running():
                raise RuntimeError(f"dataflow exited: {self.proc.output()[-3000:]}")
            if time.time() > deadline:
                self.proc.stop()
                raise RuntimeError("dataflow did not write its port file in time")
            time.sleep(0.05)
        self.url = port_file.read_text().strip()
        self.client = SyncDataflowClient(self.url, TOKEN, retries=2)

    def status(self) -> dict[str, Any]:
        return self.client.status()

    def node(self, name: str) -> dict[str, Any] | None:
        for node in self.status()["nodes"]:
            if node["name"] == name:
                return node
        return None

    def read(self, read: Callable[[store.Tx], T]) -> T:
        """``read(tx)`` on the service's store, opened read-only beside it (e.g.
        ``history.leases``): the dataflow's storage functions, no SQL of the tests' own."""
        with store.read_only(self.store) as tx:
            return read(tx)

    def stop(self) -> None:
        self.client.close()
        self.proc.stop()


def start_node(
    workdir: Path, url: str, name: str, *extra: str, runner: list[str] | None = None
) -> Proc:
    """``astraflow serve rollout --join URL --token T`` (no --recipe: it comes from the service)."""
    cmd = runner or [sys.executable, "-m", "astraflow.cli.main", "serve", "rollout"]
    return Proc(
        [*cmd, "--join", url, "--token", TOKEN, "--name", name, *extra],
        workdir / f"node-{name}.log",
    )


def wait_for(what: str, check: Callable[[], Any], timeout: float = 120, every: float = 0.1) -> Any:
    deadline = time.time() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.time() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


def freeze_holding_leases(df: Dataflow, proc: Proc, name: str, timeout: float = 60) -> int:
    """SIGSTOP ``proc`` at a moment when the service shows it holding active leases (so a kill or
    signal that follows is guaranteed to hit in-flight work); returns how many it holds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        proc.signal(signal.SIGSTOP)
        node = df.node(name)
        if node and node["active_leases"] > 0:
            return node["active_leases"]
        proc.signal(signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError(f"node {name} never held a lease")


def node_id(df: Dataflow, name: str) -> str:
    node = df.node(name)
    assert node is not None, f"node {name} never registered"
    return node["id"]


def assert_every_task_once(df: Dataflow, n_tasks: int) -> dict[str, str]:
    """Every training task is done, by exactly one lease that delivered the whole group, and no
    other lease's episodes count. Returns task id -> winning node id."""
    tasks = [t for t in df.read(history.tasks) if not t.is_eval]
    assert len(tasks) == n_tasks, f"expected {n_tasks} tasks, store has {len(tasks)}"
    assert {t.state for t in tasks} == {"done"}, Counter(t.state for t in tasks)
    leases = {lease.id: lease for lease in df.read(history.leases)}
    eps_per_lease = Counter(e.lease_id for e in df.read(history.episodes))
    winners = {}
    for task in tasks:
        assert task.winner in leases, f"task {task.id} has no winning lease"
        assert leases[task.winner].task_id == task.id
        assert eps_per_lease[task.winner] == GROUP_SIZE, (task.id, eps_per_lease[task.winner])
        winners[task.id] = leases[task.winner].node_id
        others = [lid for lid, v in leases.items() if v.task_id == task.id and lid != task.winner]
        for lid in others:
            # a losing lease may have pushed a partial group; it must have been superseded
            if eps_per_lease[lid]:
                assert leases[lid].state == "superseded", (lid, leases[lid])
    counted = sum(eps_per_lease[t.winner] for t in tasks)
    assert counted == n_tasks * GROUP_SIZE
    return winners


class DroppingProxy:
    """A loopback HTTP/1.1 proxy that forwards requests to ``upstream`` and, for the first
    ``drop`` requests whose head starts with ``match``, forwards the request, lets the service
    answer, then closes the client's connection without relaying the answer: the request landed,
    the client saw a network error. Records the bodies of matching requests."""

    def __init__(self, upstream: str, match: bytes, drop: int) -> None:
        host, port = upstream.removeprefix("http://").rsplit(":", 1)
        self.upstream = (host, int(port))
        self.match = match
        self.drop = drop
        self.dropped = 0
        self.bodies: list[bytes] = []
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.url = ""

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", 0))
        self.server = server
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        self.ready.set()
        self.loop.run_forever()
        server.close()
        self.loop.run_until_complete(server.wait_closed())
        self.loop.close()

    @staticmethod
    async def _message(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == b"content-length":
                length = int(value.strip())
        body = await reader.readexactly(length) if length else b""
        return head, body

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        try:
            while True:
                try:
                    head, body = await self._message(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                up_writer.write(head + body)
                await up_writer.drain()
                reply_head, reply_body = await self._message(up_reader)
                if head.startswith(self.match):
                    self.bodies.append(body)
                    if self.dropped < self.drop:
                        self.dropped += 1
                        writer.transport.abort()  # reset: the answer is lost
                        return
                writer.write(reply_head + reply_body)
                await writer.drain()
        finally:
            up_writer.close()
            writer.close()

    def __enter__(self) -> DroppingProxy:
        self.thread.start()
        self.ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def resume_until_done(url: str, token: str, store_call: Callable, policy: Any, max_turns: int):
    """Run an in-process :class:`RolloutNode` (``single_agent`` over the math envs, ``policy`` as
    role ``agent``) against the service at ``url`` until its one task is done, stop it, and
    return the episodes of the lease that completed the task (``store_call``: the service's
    ``store.call``, read directly)."""
    from astraflow.envs import default_registry

    from astraflow.protocol.client import DataflowClient
    from astraflow.rollout.node import NodeSettings, RolloutNode
    from astraflow.rollout.workflows import default_workflows

    registry = default_registry()
    state: dict = {}

    def run_node() -> None:
        async def main():
            state["loop"] = asyncio.get_running_loop()
            async with DataflowClient(url, token, retries=1) as dc:
                state["node"] = RolloutNode(
                    dc,
                    {"policy": policy},
                    default_workflows().get,
                    lambda env_id, kw: registry.make(env_id, **kw),
                    NodeSettings(
                        concurrency=2,
                        roles={"agent": "policy"},
                        workflow_kwargs={"max_turns": max_turns},
                        lease_wait_s=2.0,
                        drain_timeout_s=5.0,
                    ),
                )
                await state["node"].run()

        asyncio.run(main())

    thread = threading.Thread(target=run_node, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not any(t.state == "done" for t in store_call(history.tasks)):
        assert time.monotonic() < deadline and thread.is_alive(), "the task never finished"
        time.sleep(0.05)
    state["loop"].call_soon_threadsafe(state["node"].request_stop)
    thread.join(30)
    assert not thread.is_alive()
    (task,) = store_call(history.tasks)
    return [e for e in store_call(history.episodes) if e.lease_id == task.winner]
