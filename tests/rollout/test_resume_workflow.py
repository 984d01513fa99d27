"""``single_agent`` saves an episode's turns as it goes and resumes from them on another engine:
the saved tokens, log-probs and versions are kept as they were, the env goes on from its saved
turn (``load_state_dict``), and only the turns after it are generated. Real env (math multi-turn)
through the node's env runner, a scripted engine per "node", the saved episode carried through the
wire codec as the service would store and hand it back."""

from __future__ import annotations

import asyncio

import pytest
from astraflow.envs import default_registry

from astraflow.protocol import MSGPACK, PartialEpisode, Task, decode, encode
from astraflow.rollout.engines import SamplingParams
from astraflow.rollout.engines.scripted import ScriptedEngine
from astraflow.rollout.env_runner import EnvRunner
from astraflow.rollout.workflows import RolePolicy, default_workflows
from astraflow.rollout.workflows.base import EpisodeSaver

TASK = Task(env="astraflow/MathMultiTurn-v0", payload={"question": "2+3", "answer": "5"})


def _engine(reply: str, version: int) -> RolePolicy:
    engine = ScriptedEngine(lambda _obs: reply)
    engine.version = version
    return RolePolicy("policy", engine, SamplingParams(temperature=1.0, max_tokens=8))


def _play(policy: RolePolicy, saver: EpisodeSaver | None, max_turns: int = 4):
    registry = default_registry()
    wf = default_workflows().get("single_agent")

    async def run():
        runner = EnvRunner(lambda env_id, kw: registry.make(env_id, **kw), workers=1, timeout_s=10)
        try:
            return await wf.fn(
                TASK, {"agent": policy}, runner.make, max_turns=max_turns, saver=saver
            )
        finally:
            runner.shutdown()

    return asyncio.run(run())


def _saving(index: int = 0) -> tuple[EpisodeSaver, list[PartialEpisode]]:
    saved: list[PartialEpisode] = []

    async def send(partial: PartialEpisode) -> bool:
        # as the service stores it and a lease hands it back: msgpack, packed arrays
        saved.append(decode(PartialEpisode, encode(partial), MSGPACK))
        return True

    return EpisodeSaver(index, after_s=0.0, send=send), saved


def test_resumed_episode_keeps_saved_turns_and_goes_on_from_there():
    saver, saved = _saving()
    first = _play(_engine("7", version=3), saver)  # wrong every time: plays all 4 turns
    assert first.finish_reason == "truncated" and first.metrics["resumed_turns"] == 0
    # saved after turns 1, 2 and 3 (the last turn ends the episode), then, by the node, finished
    assert asyncio.run(saver.finished(first))
    assert [p.turns for p in saved] == [1, 2, 3, 4]
    assert saved[-1].finished == first and all(p.finished is None for p in saved[:-1])
    at_two = saved[1]
    assert at_two.env_state["turn"] == 2 and at_two.workflow_state["turn_rewards"] == [0.0, 0.0]

    # another node (engine version 9, answers right) takes over from turn 2
    other = _engine("5", version=9)
    episode = _play(other, EpisodeSaver(0, resume=at_two))
    assert other.engine.calls == 1  # only turn 3 was generated
    assert episode.finish_reason == "terminated" and episode.rewards == {"agent": 1.0}
    assert episode.metrics["resumed_turns"] == 2
    assert episode.info["turn"] == 3  # the env counted on from its saved turn
    assert episode.info["turn_rewards"] == [0.0, 0.0, 1.0]
    (traj,) = episode.trajectories
    (before,) = at_two.trajectories
    n = len(before.tokens)
    assert traj.tokens[:n] == before.tokens
    assert traj.logprobs[:n] == before.logprobs and traj.loss_mask[:n] == before.loss_mask
    assert traj.versions[:n] == before.versions
    assert {v for v, m in zip(traj.versions[:n], traj.loss_mask[:n], strict=True) if m} == {3}
    assert {v for v, m in zip(traj.versions[n:], traj.loss_mask[n:], strict=True) if m} == {9}
    assert traj.num_turns == 3 and traj.turn_rewards == [0.0, 0.0, 1.0]


def test_unresumable_save_is_played_from_the_start():
    saver, saved = _saving()
    _play(_engine("7", version=3), saver, max_turns=3)
    no_env = saved[0].model_copy(update={"env_state": None})
    policy = _engine("5", version=9)
    episode = _play(policy, EpisodeSaver(0, resume=no_env))
    assert episode.metrics["resumed_turns"] == 0 and policy.engine.calls == 1
    assert set(episode.trajectories[0].versions) == {-1, 9}


def test_saver_is_due_once_the_episode_ran_long_enough_then_at_most_once_per_period():
    now = [100.0]
    sent = []

    async def send(p):
        sent.append(p)
        return True

    saver = EpisodeSaver(0, after_s=10.0, send=send, clock=lambda: now[0])

    async def snapshot():
        return {"turns": 1, "trajectories": [], "env_state": {"turn": 1}}

    assert not saver.due()
    now[0] += 10
    assert saver.due()
    now[0] += 3
    with pytest.raises(ValueError):  # a snapshot must carry trajectories
        PartialEpisode(index=0, turns=1)
    assert not asyncio.run(saver.turn_done(snapshot))  # invalid fields: not saved
    assert not EpisodeSaver(0, after_s=None, send=send).due()
    # a resumed episode counts the time it ran on the node that saved it
    carried = EpisodeSaver(0, resume=_resumable(elapsed_s=12.0), after_s=10.0, send=send)
    assert carried.due()


def test_a_draining_node_saves_every_finished_turn_even_with_periodic_saves_off():
    """``force`` (the node is draining): each finished turn is saved whatever ``after_s`` says,
    so a drain cut by its timeout hands back its episodes at their last turn."""
    draining = [False]
    saved: list[PartialEpisode] = []

    async def send(partial: PartialEpisode) -> bool:
        saved.append(partial)
        return True

    saver = EpisodeSaver(0, after_s=None, send=send, force=lambda: draining[0])
    assert not saver.enabled and not saver.due()
    draining[0] = True
    assert saver.enabled and saver.due()
    episode = _play(_engine("7", version=2), saver, max_turns=3)
    assert episode.finish_reason == "truncated"
    assert [p.turns for p in saved] == [1, 2]  # the third turn ends the episode: pushed whole
    # not draining: after_s=None saves nothing, as before
    quiet, kept = _saving()
    quiet.after_s = None
    _play(_engine("7", version=2), quiet, max_turns=3)
    assert kept == []


def _resumable(elapsed_s: float) -> PartialEpisode:
    saver, saved = _saving()
    _play(_engine("7", version=1), saver, max_turns=2)
    return saved[0].model_copy(update={"elapsed_s": elapsed_s})
