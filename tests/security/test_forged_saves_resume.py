"""An honest node resumes a hostile node's saves (issue 48, finding 3): forged rewards, a forged
finished episode, an env state for another question. The real dataflow service on loopback, a
real :class:`RolloutNode` with the real ``single_agent`` workflow, a scripted engine and the math
multi-turn env.

What is pinned down: nothing that scores is taken from a save. A saved finished episode is
played again (its forged reward and id never reach the store), saved turns are credited no reward
(the env scores the turns the resuming node plays), and a save naming another task payload is
played from the start (checked on the node too, whatever the service let through).
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from astraflow.envs import default_registry
from dataflow_helpers import TOKEN, ThreadedService, make_recipe

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rollout"))
from node_helpers import resume_until_done  # noqa: E402

from astraflow.protocol import Episode, Lease, PartialEpisode, Task, Trajectory
from astraflow.protocol.client import SyncDataflowClient
from astraflow.rollout.engines.base import SamplingParams
from astraflow.rollout.engines.scripted import ScriptedEngine
from astraflow.rollout.env_runner import EnvRunner
from astraflow.rollout.node import trusted_saves
from astraflow.rollout.workflows import RolePolicy, default_workflows
from astraflow.rollout.workflows.base import EpisodeSaver

MAX_TURNS = 3
TASK = Task(
    env="astraflow/MathMultiTurn-v0", payload={"question": "2+3", "answer": "5"}, group_size=3
)


def _policy(reply: str, version: int) -> RolePolicy:
    engine = ScriptedEngine(lambda _obs: reply)
    engine.version = version
    return RolePolicy("policy", engine, SamplingParams(temperature=1.0, max_tokens=8))


def _play(task: Task, policy: RolePolicy, saver: EpisodeSaver | None) -> Episode:
    registry = default_registry()
    wf = default_workflows().get("single_agent")

    async def run():
        runner = EnvRunner(lambda env_id, kw: registry.make(env_id, **kw), workers=1, timeout_s=10)
        try:
            return await wf.fn(
                task, {"agent": policy}, runner.make, max_turns=MAX_TURNS, saver=saver
            )
        finally:
            runner.shutdown()

    return asyncio.run(run())


def _saved_after_two_turns(task: Task) -> PartialEpisode:
    """An honest save of ``task`` two (wrong) turns in."""
    saves: list[PartialEpisode] = []

    async def send(partial):
        saves.append(partial)
        return True

    _play(task, _policy("7", 1), EpisodeSaver(0, after_s=0.0, send=send))
    return next(p for p in saves if p.turns == 2)


def _forge_rewards(partial: PartialEpisode) -> PartialEpisode:
    """The saving node's word on the saved turns: 3.0 each, where the env scores 0 or 1."""
    state = dict(partial.workflow_state)
    state["turn_rewards"] = [3.0, 3.0]
    state["recorder"] = {**state["recorder"], "run_rewards": [3.0, 3.0], "credited": True}
    return partial.model_copy(update={"workflow_state": state})


def test_resumed_turns_carry_no_forged_reward():
    forged = _forge_rewards(_saved_after_two_turns(TASK))
    episode = _play(TASK, _policy("5", 2), EpisodeSaver(0, resume=forged))
    assert episode.metrics["resumed_turns"] == 2  # resumed, not replayed
    assert episode.rewards == {"agent": 1.0}  # the env's score of the turn played here
    assert episode.info["turn_rewards"] == [0.0, 0.0, 1.0]
    assert episode.trajectories[0].turn_rewards == [0.0, 0.0, 1.0]


def test_the_node_drops_saves_it_cannot_vouch_for():
    honest = _saved_after_two_turns(TASK)
    finished = Episode(
        task_id=TASK.id,
        trajectories=[Trajectory(role="agent", tokens=[1, 2], loss_mask=[0, 1],
                                 logprobs=[0.0, -0.1], versions=[-1, 1])],
        rewards={"agent": 3.0},
    )  # fmt: skip
    other_state = {**honest.env_state, "task": {"question": "3+4", "answer": "7"}}
    lease = Lease(
        task=TASK,
        node_id="n",
        deadline=time.time() + 60,
        partials=[
            honest,
            PartialEpisode(index=1, turns=1, finished=finished),
            honest.model_copy(update={"index": 2, "env_state": other_state}),
        ],
    )
    assert list(trusted_saves(lease)) == [0]


def test_an_honest_node_never_pushes_a_forged_finished_save(tmp_path):
    """A hostile node saves a finished episode with reward 3.0 (and an honest save with forged
    turn rewards) and hands its lease back; the honest node that takes the task over pushes only
    rewards its own env computed."""
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
        evil = client.register(policies={"policy": 1}, name="evil").node_id
        (lease,) = client.lease(node_id=evil, max_tasks=1, versions={"policy": 1}).leases
        resumable = _forge_rewards(_saved_after_two_turns(lease.task))
        forged = _play(lease.task, _policy("7", 1), None).model_copy(
            update={"rewards": {"agent": 3.0}}
        )
        stored = client.save_partials(
            node_id=evil,
            lease_id=lease.id,
            partials=[resumable, PartialEpisode(index=1, turns=MAX_TURNS, finished=forged)],
        )
        assert stored.accepted and stored.stored == 2
        client.release(evil, [lease.id])

        policy = _policy("beta", 1)  # never right: every reward the env gives is 0
        episodes = resume_until_done(svc.url, TOKEN, svc.service.store.call, policy, MAX_TURNS)
        assert len(episodes) == 2
        assert forged.id not in {e.id for e in episodes}
        assert [e.rewards for e in episodes] == [{"agent": 0.0}, {"agent": 0.0}]
