"""A rollout node resumes the episodes a lease carries (``Lease.partials``) instead of playing them
again: the real dataflow service on loopback, a real :class:`RolloutNode` in-process with the real
``single_agent`` workflow, a scripted engine and the math multi-turn env.

A first "node" (the workflow run directly with its own scripted engine) plays the task's episodes
and saves them: episode 0 two turns in, episode 1 finished. Its lease is handed back; the node
under test takes the task over, generates only episode 0's last two turns and plays episode 1
again: a saved finished episode is never pushed as sent (its rewards and id were the saving node's
word; issue 48, findings 1 and 3), so its reward comes from this node's env.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dataflow"))

from astraflow.envs import default_registry  # noqa: E402
from dataflow_helpers import TOKEN, ThreadedService, make_recipe  # noqa: E402
from node_helpers import resume_until_done  # noqa: E402

from astraflow.dataflow.storage import history  # noqa: E402
from astraflow.protocol import PartialEpisode  # noqa: E402
from astraflow.protocol.client import SyncDataflowClient  # noqa: E402
from astraflow.rollout.engines.base import SamplingParams  # noqa: E402
from astraflow.rollout.engines.scripted import ScriptedEngine  # noqa: E402
from astraflow.rollout.env_runner import EnvRunner  # noqa: E402
from astraflow.rollout.workflows import RolePolicy, default_workflows  # noqa: E402
from astraflow.rollout.workflows.base import EpisodeSaver  # noqa: E402

MAX_TURNS = 4


def _policy(reply: str, version: int) -> RolePolicy:
    engine = ScriptedEngine(lambda _obs: reply)
    engine.version = version
    return RolePolicy("policy", engine, SamplingParams(temperature=1.0, max_tokens=8))


def _saved_by_first_node(task) -> dict[int, PartialEpisode]:
    """Episode 0 saved after turn 2, episode 1 saved finished: what a node that died would have
    left (played with its own engine, wrong answers, version 3)."""
    registry = default_registry()
    wf = default_workflows().get("single_agent")
    saves: dict[int, list[PartialEpisode]] = {0: [], 1: []}

    async def play(index: int) -> None:
        async def send(partial):
            saves[index].append(partial)
            return True

        saver = EpisodeSaver(index, after_s=0.0, send=send)
        runner = EnvRunner(lambda env_id, kw: registry.make(env_id, **kw), workers=1)
        try:
            ep = await wf.fn(
                task, {"agent": _policy("alpha", 3)}, runner.make, max_turns=MAX_TURNS, saver=saver
            )
            await saver.finished(ep)
        finally:
            runner.shutdown()

    asyncio.run(play(0))
    asyncio.run(play(1))
    return {0: next(p for p in saves[0] if p.turns == 2), 1: saves[1][-1]}


def test_node_resumes_saved_episodes_of_a_handed_back_lease(tmp_path):
    recipe = make_recipe(
        tmp_path,
        policies={"policy": {"model": "builtin:tiny-arith", "trainable": False}},
        tasks={
            "env": "astraflow/MathMultiTurn-v0",
            "group_size": 2,
            "epochs": 1,
            "sets": [{"name": "arith", "limit": 1}],
        },
        workflow={"name": "single_agent", "roles": {"agent": "policy"}, "max_turns": MAX_TURNS},
    )
    with (
        ThreadedService(recipe, tmp_path / "df.db") as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=0) as client,
    ):
        dead = client.register(policies={"policy": 3}, name="dead").node_id
        (lease,) = client.lease(node_id=dead, max_tasks=1, versions={"policy": 3}).leases
        saved = _saved_by_first_node(lease.task)
        assert saved[1].finished is not None and saved[0].finished is None
        stored = client.save_partials(
            node_id=dead, lease_id=lease.id, partials=list(saved.values())
        )
        assert stored.accepted and stored.stored == 2
        client.release(dead, [lease.id])  # handed back (a drain), as an expiry would

        policy = _policy("beta", 9)
        episodes = resume_until_done(svc.url, TOKEN, svc.service.store.call, policy, MAX_TURNS)
        assert len(episodes) == 2
        # episode 0 resumed at turn 2; episode 1 played again from the start, under a new id
        assert saved[1].finished.id not in {e.id for e in episodes}
        by_resumed = sorted(episodes, key=lambda e: e.info["metrics"]["resumed_turns"])
        replayed, resumed = by_resumed
        assert replayed.info["metrics"]["resumed_turns"] == 0
        assert resumed.info["metrics"]["resumed_turns"] == 2
        assert resumed.info["metrics"]["turns"] == MAX_TURNS
        # episode 0's last two turns, and all of episode 1
        assert policy.engine.calls == (MAX_TURNS - 2) + MAX_TURNS
        assert svc.service.store.call(history.partials) == []
