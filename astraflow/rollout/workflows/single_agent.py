"""``single_agent``: the generic multi-turn loop of one policy over any registered env.

Env calls are awaited on the env the node's ``make_env`` returns (an ``AsyncEnv``), so a slow env
step (a sandbox run, a database query) never blocks other episodes on the node. An env whose reset
info carries ``messages`` (chat turns, e.g. AgentBench ALFWorld's one-shot dialogue) opens the
conversation with them instead of its observation as one user message; a step whose info carries
``messages`` (SkyRL-style chat observations, any role incl. ``tool``) adds them as chat turns. Each
turn's reward is kept in order (``Episode.info["turn_rewards"]``, and on the trajectory, per run of
generated tokens, for turn-level credit); the episode's reward is their sum.

The sequence is bounded by ``min(max_total_tokens, engine context - 1)`` (``workflows.budget``): an
episode that runs out ends with ``finish_reason = "length"`` and keeps the reward its turns earned.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, TypeVar

from astraflow.protocol import Episode, Task, Trajectory
from astraflow.rollout.workflows import budget
from astraflow.rollout.workflows.base import EnvFactory, EpisodeSaver, RolePolicy, WorkflowError
from astraflow.rollout.workflows.tokens import ChatRenderer, check_turn_messages

log = logging.getLogger("astraflow.rollout.workflows")
T = TypeVar("T")


class TurnRecorder:
    """Accumulates one role's token sequence with loss mask, log-probs and versions, and the
    reward of each generated turn.

    A turn's reward belongs to the run of generated tokens (loss mask 1) it produced: the
    trajectory's ``turn_rewards`` hold one reward per run, which is what the trainer's turn-level
    credit (``trainer.turn_discount``) reads. Turns without tokens credit the run before them (or
    the first one, if none came before)."""

    def __init__(self, role: str, prompt_ids: list[int]):
        self.role = role
        self.tokens = list(prompt_ids)
        self.loss_mask = [0] * len(prompt_ids)
        self.logprobs = [0.0] * len(prompt_ids)
        self.versions = [-1] * len(prompt_ids)
        self.turns = 0
        #: reward per run of generated tokens
        self.run_rewards: list[float] = []
        #: the run each generated turn (add_generated call) belongs to (-1: before any run)
        self._turn_run: list[int] = []
        self._pending = 0.0  # credited before the first run existed
        self._credited = False

    def add_generated(self, ids: list[int], logprobs: list[float], version: int) -> None:
        if ids and not (self.loss_mask and self.loss_mask[-1] == 1):
            self.run_rewards.append(self._pending if not self.run_rewards else 0.0)
            self._pending = 0.0
        self._turn_run.append(len(self.run_rewards) - 1)
        self.tokens += ids
        self.loss_mask += [1] * len(ids)
        self.logprobs += list(logprobs)
        self.versions += [version] * len(ids)
        self.turns += 1

    def add_context(self, ids: list[int]) -> None:
        self.tokens += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [-1] * len(ids)

    def add_turn_reward(self, reward: float, turn: int = -1) -> None:
        """Credit ``reward`` to generated turn ``turn`` (its index among this role's
        generations; default the latest)."""
        run = self._turn_run[turn] if self._turn_run else -1
        self._credited = True
        if run < 0:
            if self.run_rewards:
                self.run_rewards[0] += float(reward)
            else:
                self._pending += float(reward)
        else:
            self.run_rewards[run] += float(reward)

    def forget_rewards(self) -> None:
        """Credit every turn so far no reward: the turns of a resumed save were scored by the
        node that saved them, whose word is not taken (untrusted nodes; see
        :func:`resume_saved`)."""
        self.run_rewards = [0.0] * len(self.run_rewards)
        self._pending = 0.0

    def state(self) -> dict[str, Any]:
        """What :meth:`restore` needs besides the trajectory (plain JSON)."""
        return {
            "turns": self.turns,
            "turn_run": list(self._turn_run),
            "run_rewards": list(self.run_rewards),
            "pending": self._pending,
            "credited": self._credited,
        }

    @classmethod
    def restore(cls, traj: Trajectory, state: dict[str, Any]) -> TurnRecorder:
        """A recorder that goes on from a saved trajectory: its tokens, loss mask, log-probs and
        versions as saved (never regenerated). Raises on a malformed state."""
        rec = cls(traj.role, [])
        rec.tokens = list(traj.tokens)
        rec.loss_mask = list(traj.loss_mask)
        rec.logprobs = list(traj.logprobs)
        rec.versions = list(traj.versions)
        rec.turns = int(state["turns"])
        rec._turn_run = [int(x) for x in state["turn_run"]]
        rec.run_rewards = [float(x) for x in state["run_rewards"]]
        rec._pending = float(state["pending"])
        rec._credited = bool(state["credited"])
        return rec

    @property
    def generated_turns(self) -> int:
        return len(self._turn_run)

    def trajectory(self) -> Trajectory:
        return Trajectory(
            role=self.role,
            tokens=self.tokens,
            loss_mask=self.loss_mask,
            logprobs=self.logprobs,
            versions=self.versions,
            num_turns=self.turns,
            turn_rewards=list(self.run_rewards) if self._credited and self.run_rewards else None,
        )


def sampling_for(task: Task, policy: RolePolicy):
    """Eval tasks are greedy; training tasks use the policy's sampling settings."""
    params = policy.sampling
    if task.meta.get("greedy"):
        params = replace(params, temperature=0.0, top_p=1.0)
    if task.meta.get("max_tokens"):
        params = replace(params, max_tokens=int(task.meta["max_tokens"]))
    return replace(params, n=1)


async def single_agent(
    task: Task,
    policies: Mapping[str, RolePolicy],
    make_env: EnvFactory,
    *,
    max_turns: int = 1,
    max_total_tokens: int = 4096,
    system_prompt: str | None = None,
    saver: EpisodeSaver | None = None,
    **env_kwargs: Any,
) -> Episode:
    """``saver`` (given by the node, see :class:`EpisodeSaver`): resume from its saved turns,
    and save the episode after finished turns when it is due."""
    if "agent" not in policies:
        raise WorkflowError(f"single_agent needs the role 'agent'; got roles {sorted(policies)}")
    agent = policies["agent"]
    env = await make_env(task.env, {"max_turns": max_turns, **env_kwargs})
    started = time.perf_counter()
    gen_s = env_s = 0.0
    try:
        renderer = ChatRenderer(agent.tokenizer, system=system_prompt)
        t0 = time.perf_counter()
        resumed = await resume_saved(saver, env, _read_state)
        if resumed is not None:
            rec, (turn_rewards, info), first_turn = resumed
        else:
            obs, info = await env.reset(seed=None, options={"task": task.payload})
            # An env may open with chat turns of its own (a benchmark's few-shot dialogue).
            rec = TurnRecorder("agent", renderer.prompt_ids(obs, info.get("messages")))
            turn_rewards = []
            first_turn = 0
        env_s += time.perf_counter() - t0
        finish = "turn_limit"
        params = sampling_for(task, agent)
        limit = budget.context_limit(agent.engine, max_total_tokens)
        for turn in range(first_turn, max_turns):
            if budget.room(limit, rec.tokens) <= 0:
                finish = budget.LENGTH
                break
            t0 = time.perf_counter()
            (gen,) = await agent.engine.generate(
                rec.tokens, budget.capped(params, limit, rec.tokens)
            )
            gen_s += time.perf_counter() - t0
            rec.add_generated(gen.token_ids, gen.logprobs, gen.version)
            text = agent.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
            t0 = time.perf_counter()
            obs, reward, terminated, truncated, info = await env.step(text)
            env_s += time.perf_counter() - t0
            turn_rewards.append(float(reward))
            rec.add_turn_reward(float(reward))
            if terminated:
                finish = "terminated"
                break
            if truncated:
                finish = "truncated"
                break
            turn_messages = info.get("messages")
            if turn_messages:
                feedback = renderer.messages_ids(check_turn_messages(turn_messages), gen.token_ids)
            else:
                feedback = renderer.observation_ids(obs, gen.token_ids)
            if not budget.fits(limit, rec.tokens, feedback):
                # No room to answer the feedback: skip it and end here, scored as played.
                finish = budget.LENGTH
                break
            rec.add_context(feedback)
            if saver is not None:
                await save_turn(
                    saver, rec, env, turn + 1,
                    lambda last=info: {"turn_rewards": list(turn_rewards), "info": _jsonable(last)},
                )  # fmt: skip
        return Episode(
            task_id=task.id,
            trajectories=[rec.trajectory()],
            rewards={"agent": sum(turn_rewards)},
            finish_reason=finish,
            info={**_jsonable(info), "turn_rewards": turn_rewards},
            metrics={
                "generate_s": gen_s,
                "env_s": env_s,
                "wall_s": time.perf_counter() - started,
                "turns": float(rec.turns),
                "tokens": float(len(rec.tokens)),
                # turns played by an earlier node and resumed here, not played again
                "resumed_turns": float(first_turn),
            },
        )
    finally:
        await env.close()


async def save_turn(
    saver: EpisodeSaver, rec: TurnRecorder, env: Any, turns: int, own: Callable[[], dict[str, Any]]
) -> None:
    """Offer ``saver`` the episode as it stands after ``turns`` finished turns: the sequence so
    far, the env's state and the workflow's own part (``own()``, read only when a save is due),
    which :func:`resume_saved` hands back to the workflow's ``read``."""

    async def snapshot() -> dict[str, Any]:
        return {
            "turns": turns,
            "trajectories": [rec.trajectory()],
            "env_state": await env.state_dict(),
            "workflow_state": {"recorder": rec.state(), **own()},
        }

    await saver.turn_done(snapshot)


def _read_state(state: dict[str, Any]) -> tuple[list[float], dict[str, Any]]:
    """``single_agent``'s own part of a save: one (zero) reward per saved turn, the saved
    rewards themselves not carried (see :func:`resume_saved`), and the last env info."""
    return [0.0 for _ in state["turn_rewards"]], dict(state.get("info") or {})


async def resume_saved(
    saver: EpisodeSaver | None, env: Any, read: Callable[[dict[str, Any]], T]
) -> tuple[TurnRecorder, T, int] | None:
    """(recorder, ``read(workflow_state)``, next turn) of the episode's saved turns, the env put
    back into its saved state; None when there is nothing to resume (or it cannot be: an env
    without ``load_state_dict``, a malformed save, including a ``KeyError``, ``TypeError`` or
    ``ValueError`` from the workflow's own ``read``), and the episode starts afresh. Shared by the
    resumable workflows (``single_agent``, ``tool_agent``).

    Rewards are never carried: the saved turns are credited no reward (the recorder's
    :meth:`~TurnRecorder.forget_rewards`, and each workflow's ``read`` zeroes its own), so every
    reward of the episode comes from this node's env. Why: the save was written by another node,
    and nodes are untrusted (issue 48, finding 3: forged turn rewards of 3.0 trained where the
    env scores 0 or 1). The cost: an env that rewards turns before the last one (a
    ``format_reward``) loses those turns' rewards on a resumed episode."""
    partial = saver.resume if saver is not None else None
    if partial is None or partial.finished is not None:
        return None
    if partial.env_state is None or not env.saves_state:
        log.info("episode %d: saved turns not resumable here (no env state)", saver.index)
        return None
    try:
        (traj,) = partial.trajectories
        state = partial.workflow_state
        rec = TurnRecorder.restore(traj, state["recorder"])
        rec.forget_rewards()
        own = read(state)
        await env.load_state_dict(partial.env_state)
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        log.warning("episode %d: saved turns not resumed (%s); playing it afresh", saver.index, exc)
        return None
    return rec, own, partial.turns


def _jsonable(info: dict[str, Any]) -> dict[str, Any]:
    """Keep only msgpack-friendly values of an env's info dict."""
    out: dict[str, Any] = {}
    for k, v in info.items():
        if isinstance(v, (str, int, float, bool)) or v is None:
            out[k] = v
        elif isinstance(v, (list, tuple)) and all(
            isinstance(x, (str, int, float, bool)) for x in v
        ):
            out[k] = list(v)[:256]
        elif isinstance(v, dict):
            out[k] = _jsonable(v)
        else:
            out[k] = str(v)[:1024]
    return out
