"""Env calls never block the rollout node's event loop (astraflow/rollout/env_runner.py).

Node tests run a real :class:`RolloutNode` in this process (so the test can hand it test envs and
look at its env runner) against a real ``astraflow serve dataflow`` on loopback, with the
built-in tiny model on the transformers engine. Runner tests drive :class:`EnvRunner` directly,
with the real code env and its real (process) sandbox for the kill check.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from astraflow.dataflow.storage import history
from astraflow.protocol.client import DataflowClient, SyncDataflowClient
from astraflow.recipe import load_recipe
from astraflow.rollout.env_runner import EnvCallTimeout, EnvRunner
from astraflow.rollout.main import NodeOptions, build_policies
from astraflow.rollout.node import NodeSettings, RolloutNode
from astraflow.rollout.workflows import default_workflows

sys.path.insert(0, str(Path(__file__).resolve().parent))

import env_runner_envs as test_envs  # noqa: E402
from node_helpers import TOKEN, Dataflow, assert_every_task_once, wait_for  # noqa: E402

pytestmark = pytest.mark.timeout(150)


def _recipe(out: Path, env: str, *, n_tasks: int, group_size: int, max_turns: int, **kw) -> str:
    env_kwargs = ", ".join(f"{k} = {v}" for k, v in kw.items())
    return f"""
[run]
name = "envrunner"
output_dir = "{out}"
max_steps = 1

[policies.policy]
model = "builtin:tiny-arith"
trainable = false
sampling = {{ temperature = 1.0, max_tokens = 4 }}

[tasks]
env = "{env}"
env_kwargs = {{ {env_kwargs} }}
group_size = {group_size}
epochs = 1
sets = [{{ name = "arith", split = "train", limit = {n_tasks} }}]

[workflow]
max_turns = {max_turns}

[dataflow]
lease_timeout_s = 60.0
heartbeat_interval_s = 0.5

[rollout]
device = "cpu"
"""


@pytest.fixture(scope="module")
def tiny_policies(tmp_path_factory):
    """The built-in tiny model on the transformers engine, built once for the module."""
    out = tmp_path_factory.mktemp("policies")
    path = out / "recipe.toml"
    path.write_text(_recipe(out, test_envs.SLEEPY, n_tasks=1, group_size=1, max_turns=1))
    policies = build_policies(load_recipe(path), NodeOptions(join="", token="", device="cpu"))
    yield policies
    for p in policies.values():
        asyncio.run(p.engine.close())


def _run_node(df: Dataflow, policies, make_env, *, concurrency: int, **settings) -> RolloutNode:
    recipe = load_recipe(df.recipe)

    async def main() -> RolloutNode:
        client = DataflowClient(df.url, TOKEN)
        node = RolloutNode(
            client,
            policies,
            default_workflows().get,
            # the recipe's env kwargs go to the env factory, as in the service's make_env
            lambda env_id, kw: make_env(env_id, {**recipe.tasks.env_kwargs, **kw}),
            NodeSettings(
                concurrency=concurrency,
                name="N",
                workflow_kwargs={"max_turns": recipe.workflow.max_turns},
                roles=dict(recipe.workflow.roles),
                **settings,
            ),
        )
        try:
            await node.run()
        finally:
            await client.close()
        return node

    return asyncio.run(main())


class HeartbeatWatch:
    """Samples the service's view of node ``name`` from another thread: the longest time the
    service saw the node silent while it was registered."""

    def __init__(self, url: str, name: str) -> None:
        self.client = SyncDataflowClient(url, TOKEN, retries=2)
        self.name = name
        self.silences: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for node in self.client.status()["nodes"]:
                if node["name"] == self.name and node["state"] != "left":
                    self.silences.append(node["seconds_since_heartbeat"])
            self._stop.wait(0.1)

    def __enter__(self) -> HeartbeatWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)
        self.client.close()


# ------------------------------------------------------------------------------------ node tests
@pytest.mark.slow
def test_slow_sync_steps_overlap_and_heartbeats_go_on(tmp_path, tiny_policies):
    """32 episodes of 2 turns, each step blocking its thread for 1 s: on the node's loop that is
    64 s of silence; in the runner's pool the turns of all episodes overlap."""
    turns, step_s, n_tasks, group = 2, 1.0, 4, 8
    df = Dataflow(
        tmp_path / "df",
        _recipe(tmp_path / "runs", test_envs.SLEEPY, n_tasks=n_tasks, group_size=group,
                max_turns=turns, step_s=step_s),
    )  # fmt: skip
    try:
        with HeartbeatWatch(df.url, "N") as watch:
            t0 = time.monotonic()
            node = _run_node(df, tiny_policies, test_envs.factory(), concurrency=32, env_workers=32)
            wall = time.monotonic() - t0
        episodes = n_tasks * group
        serial = episodes * turns * step_s
        assert node.stats.episodes == episodes and node.stats.errors == 0, node.stats
        assert wall < serial / 2, f"{episodes} episodes took {wall:.1f}s (serial: {serial:.0f}s)"
        assert len(watch.silences) > 5, "the watcher never saw the node"
        # heartbeat every 0.5 s; a loop blocked by one round of steps would be silent for 32 s
        assert max(watch.silences) < 3.0, f"node silent for {max(watch.silences):.1f}s"
        rows = [(e.finish_reason, e.error) for e in df.read(history.episodes)]
        assert len(rows) == episodes and {r for r in rows} == {("truncated", None)}, rows
        assert node.env_runner.threads <= 32
    finally:
        df.stop()


def test_hung_step_is_cut_recorded_and_the_node_goes_on(tmp_path, tiny_policies):
    """The first step hangs until its env is closed: it is cut at env_timeout_s, its env is
    closed from a fresh thread (which frees the stuck thread), the episode is stored with
    finish_reason env_timeout and the reason, and every later task runs normally."""
    n_tasks = 3
    df = Dataflow(
        tmp_path / "df",
        _recipe(tmp_path / "runs", test_envs.HANG_ONCE, n_tasks=n_tasks, group_size=2, max_turns=1),
    )
    try:
        t0 = time.monotonic()
        node = _run_node(
            df, tiny_policies, test_envs.factory(), concurrency=2, env_workers=2, env_timeout_s=0.5
        )
        wall = time.monotonic() - t0
        assert test_envs.HangOnceEnv.hung.is_set()
        assert test_envs.HangOnceEnv.released.is_set(), "the timed-out env was never closed"
        assert test_envs.HangOnceEnv.returned.wait(5), "the stuck step never got out"
        wait_for("the stuck thread to exit", lambda: node.env_runner.stuck_threads == 0, 10)
        assert node.stats.env_timeouts == 1 and node.stats.episodes == 2 * n_tasks - 1
        assert wall < 60, wall
        assert_every_task_once(df, n_tasks)  # the node went on and finished the run
        rows = [(e.finish_reason, e.error) for e in df.read(history.episodes)]
        cut = [r for r in rows if r[0] == "env_timeout"]
        assert len(cut) == 1, rows
        assert "env.step took longer than rollout.env_timeout_s = 0.5s" in cut[0][1]
        assert test_envs.HANG_ONCE in cut[0][1]
        assert sorted(r for r in rows if r not in cut) == [("truncated", None)] * (2 * n_tasks - 1)
    finally:
        df.stop()


# ---------------------------------------------------------------------------------- runner tests
def test_async_env_is_awaited_natively_without_threads():
    """areset/astep/aclose run on the loop: eight 0.2 s steps through a 1-thread pool overlap,
    no call but the constructor goes to the pool, and the sync methods (which raise) are never
    called."""
    runner = EnvRunner(test_envs.factory(), workers=1, timeout_s=5)
    loop_thread = threading.current_thread()
    test_envs.AsyncEnv.threads.clear()

    async def episode():
        env = await runner.make(test_envs.ASYNC, {"max_turns": 1})
        try:
            await env.reset(options={"task": {"question": "1+1"}})
            return await env.step("2")
        finally:
            await env.close()

    async def main():
        t0 = time.monotonic()
        results = await asyncio.gather(*(episode() for _ in range(8)))
        return results, time.monotonic() - t0

    try:
        results, wall = asyncio.run(main())
    finally:
        runner.shutdown()
    assert [r[3] for r in results] == [True] * 8  # truncated after one turn
    assert runner.sync_calls == 8  # the constructions only
    assert set(test_envs.AsyncEnv.threads) == {loop_thread}
    assert test_envs.AsyncEnv.closed == 8
    assert wall < 1.2, f"8 overlapping 0.2 s steps took {wall:.2f}s"


def test_async_env_past_the_limit_is_cancelled_and_closed():
    runner = EnvRunner(test_envs.factory(), workers=1, timeout_s=0.05)
    closed = test_envs.AsyncEnv.closed

    async def main():
        env = await runner.make(test_envs.ASYNC, {})
        await env.reset()
        with pytest.raises(
            EnvCallTimeout, match=r"env.step took longer than rollout.env_timeout_s = 0.05s"
        ):
            await env.step("x")  # astep sleeps 0.2 s
        await env.close()  # already closed by the kill: a no-op

    try:
        asyncio.run(main())
    finally:
        runner.shutdown()
    assert test_envs.AsyncEnv.closed == closed + 1


def test_limit_counts_from_start_and_a_stuck_thread_is_replaced():
    """With one worker: a call queued behind another is not charged for the wait; a call stuck
    past the limit (a plain sleep that no close can reach) is written off and a replacement
    thread serves the next call at once."""
    runner = EnvRunner(test_envs.factory(), workers=1, timeout_s=0.5)

    async def main():
        a = await runner.make(test_envs.SLEEPY, {"step_s": 0.3})
        b = await runner.make(test_envs.SLEEPY, {"step_s": 0.3})
        # 0.3 s queued + 0.3 s running: over the limit end to end, within it per call
        await asyncio.gather(a.step("x"), b.step("x"))
        stuck = await runner.make(test_envs.SLEEPY, {"step_s": 3.0})
        with pytest.raises(EnvCallTimeout, match="env.step took longer than"):
            await stuck.step("x")
        assert runner.stuck_threads == 1 and runner.threads <= 1
        t0 = time.monotonic()
        c = await runner.make(test_envs.SLEEPY, {"step_s": 0.0})
        await c.step("x")
        return time.monotonic() - t0

    try:
        took = asyncio.run(main())
    finally:
        runner.shutdown()
    assert took < 0.4, f"the pool stayed short after a stuck call: next call took {took:.2f}s"


def test_code_env_sandbox_process_is_killed_on_timeout():
    """A Code-v0 step whose program never ends: at the limit the env is closed from a fresh
    thread, the sandbox kills the running program (its PID is gone) and the step's thread is
    freed, long before the sandbox's own 30 s wall clock."""
    from astraflow.envs import default_registry

    reg = default_registry()
    runner = EnvRunner(lambda env_id, kw: reg.make(env_id, **kw), workers=1, timeout_s=1.0)
    task = {
        "id": "hang",
        "prompt": "",
        "entry_point": "f",
        "tests": "def check(candidate):\n    assert candidate(1) == 1\n",
    }
    reply = "```python\nimport time\ntime.sleep(300)\ndef f(x):\n    return x\n```"
    me = psutil.Process()

    def sandbox_pids() -> list[int]:
        found = []
        for child in me.children(recursive=True):
            try:
                if any(part.endswith("main.py") for part in child.cmdline()):
                    found.append(child.pid)
            except psutil.Error:
                continue
        return found

    async def main():
        env = await runner.make("astraflow/Code-v0", {"sandbox": "process", "timeout_s": 30.0})
        await env.reset(options={"task": task})
        step = asyncio.ensure_future(env.step(reply))
        pids: list[int] = []
        while not pids and not step.done():
            await asyncio.sleep(0.05)
            pids = sandbox_pids()
        assert pids, "the sandboxed program never started"
        t0 = time.monotonic()
        with pytest.raises(
            EnvCallTimeout, match="env.step took longer than rollout.env_timeout_s = 1s"
        ):
            await step
        await env.close()
        return pids, time.monotonic() - t0

    try:
        pids, took = asyncio.run(main())
        assert took < 10, took
        for pid in pids:
            assert not psutil.pid_exists(pid), f"sandbox process {pid} survived the timeout"
        wait_for("the step's thread to come back", lambda: runner.stuck_threads == 0, 10)
    finally:
        runner.shutdown()


def test_calls_after_shutdown_fail_clearly():
    runner = EnvRunner(test_envs.factory(), workers=1, timeout_s=1)
    runner.shutdown()
    with pytest.raises(RuntimeError, match="env runner is shut down"):
        asyncio.run(runner.make(test_envs.SLEEPY, {}))
