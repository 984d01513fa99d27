"""Workflow contract: an async function that runs one episode of a task with policies by role.

A workflow sees each role through a :class:`RolePolicy` (the engine serving that role's policy, its
tokenizer and sampling settings) and creates envs through an ``EnvFactory``. It returns one
:class:`~astraflow.protocol.Episode`; the node runs ``task.group_size`` of them per task. Workflows
never talk to the dataflow service or the weight store: they are pure rollout logic, which is what
lets third parties add their own through the ``astraflow.workflows`` entry-point group.

Envs are async to a workflow: ``env = await make_env(env_id, kwargs)`` returns an
:class:`~astraflow.rollout.env_runner.AsyncEnv`, and every call on it is awaited
(``await env.reset(seed=..., options=...)``, ``await env.step(action)``, ``await env.close()``,
the latter in a ``finally``). The node runs sync envs in a bounded thread pool and awaits envs
with ``areset``/``astep``/``aclose`` natively, each call bounded by ``rollout.env_timeout_s``; a
call past that raises :class:`~astraflow.rollout.env_runner.EnvCallTimeout`, which a workflow
should let propagate (the node records the episode as ``finish_reason="env_timeout"``). A
workflow must never call a sync env method itself: that would block every episode on the node.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from astraflow.errors import AstraFlowError
from astraflow.protocol import Episode, PartialEpisode, Task
from astraflow.rollout.engines.base import Engine, SamplingParams

log = logging.getLogger("astraflow.rollout.workflows")


@dataclass
class RolePolicy:
    """One served policy: its engine, default sampling and whether it is trained.

    The one policy-serving type: a node holds one per policy it serves (``rollout/main.py``) and
    hands a workflow one per role, the same object with the group's sampling priority set. It lives
    with the workflow contract, not in ``astraflow.protocol``: it carries a live engine, never
    crosses a process boundary, and third-party workflows import it from here."""

    policy: str
    engine: Engine
    sampling: SamplingParams
    trainable: bool = True
    #: how this policy writes tool calls (``policies.NAME.tool_parser``; "auto": its chat template)
    tool_parser: str = "auto"

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def parser(self):
        """This policy's :class:`~astraflow.tools.parsers.ToolParser`."""
        from astraflow.tools.parsers import get_tool_parser

        return get_tool_parser(self.tool_parser, self.tokenizer)


#: ``await make_env(env_id, kwargs)`` -> an ``AsyncEnv`` (see the module docstring). On a node this
#: is :meth:`astraflow.rollout.env_runner.EnvRunner.make`.
EnvFactory = Callable[[str, dict[str, Any]], Awaitable[Any]]


class Workflow(Protocol):
    def __call__(
        self,
        task: Task,
        policies: Mapping[str, RolePolicy],
        make_env: EnvFactory,
        **kwargs: Any,
    ) -> Awaitable[Episode]: ...


@dataclass(frozen=True)
class WorkflowSpec:
    name: str
    fn: Workflow
    roles: tuple[str, ...]
    description: str = ""
    source: str = "astraflow"
    defaults: dict[str, Any] = field(default_factory=dict)
    #: the workflow takes a ``saver`` kwarg (an :class:`EpisodeSaver`): it resumes an episode
    #: from saved turns and saves its turns as it goes (docs/elastic.md)
    resumable: bool = False


#: ``await send(partial)``: hands a saved episode to the dataflow service (the node's
#: ``POST /partials``); never raises.
SendPartial = Callable[[PartialEpisode], Awaitable[bool]]


class EpisodeSaver:
    """One episode's link to its saved turns, given to a resumable workflow as ``saver``.

    ``resume`` is what an earlier node saved of this episode (None: play it from the start). After
    each finished turn the workflow calls ``await saver.turn_done(snapshot)``; the saver decides
    whether the episode is worth saving now and only then calls ``await snapshot()`` (which reads
    the env's state, an env call) for the fields of a
    :class:`~astraflow.protocol.PartialEpisode` (``turns``, ``trajectories``, ``env_state``,
    ``workflow_state``).

    When (``rollout.checkpoint_after_s``, None: never): once the episode has run that long, counted
    over every node that played it, and then at most once per that many seconds. So a node's
    death loses at most about that long plus one turn of an episode, short episodes are never
    saved, and an episode costs at most one save per ``checkpoint_after_s``. An episode whose env
    cannot save its state (no ``state_dict``) is never saved: it would be played from the start
    anyway.

    ``force`` (the node's "draining" flag): while it is true, every finished turn is saved,
    whatever ``after_s`` says (None included), so a node that is drained (SIGTERM, the
    autoscaler's shrink) hands back its unfinished episodes at their last turn when the drain
    timeout cuts them, instead of throwing their turns away.
    """

    def __init__(
        self,
        index: int,
        resume: PartialEpisode | None = None,
        after_s: float | None = None,
        send: SendPartial | None = None,
        clock: Callable[[], float] = time.monotonic,
        force: Callable[[], bool] | None = None,
    ) -> None:
        self.index = index
        self.resume = resume
        self.after_s = after_s
        self._send = send
        self._clock = clock
        self._force = force
        self._started = clock() - (resume.elapsed_s if resume is not None else 0.0)
        self._last: float | None = None
        #: saves handed to the service (accepted or not)
        self.saves = 0

    @property
    def enabled(self) -> bool:
        return self._send is not None and (self.after_s is not None or self._forced())

    def _forced(self) -> bool:
        return self._force is not None and self._force()

    def elapsed(self) -> float:
        """Seconds this episode has run, on this node and on those that saved it before."""
        return self._clock() - self._started

    def due(self) -> bool:
        if not self.enabled:
            return False
        if self._forced():
            return True
        assert self.after_s is not None  # enabled and not forced
        now = self._clock()
        if now - self._started < self.after_s:
            return False
        return self._last is None or now - self._last >= self.after_s

    async def turn_done(self, snapshot: Callable[[], Awaitable[dict[str, Any]]]) -> bool:
        """Save the episode if it is due; True when a save was handed to the service."""
        if not self.due():
            return False
        fields = await snapshot()
        if fields.get("env_state") is None:
            return False
        try:
            partial = PartialEpisode(index=self.index, elapsed_s=self.elapsed(), **fields)
        except ValueError as exc:  # e.g. an env state past the wire's bounds: not saved
            log.warning("episode %d not saved: %s", self.index, exc)
            return False
        return await self._save(partial)

    async def finished(self, episode: Episode) -> bool:
        """The episode ended; its group is pushed only when every episode of it has. Save it
        whole when it was worth saving (it had been saved before, or it is due), so that a node
        that takes the task over does not play it again."""
        if not self.enabled or (self._last is None and not self.due()):
            return False
        turns = max((t.num_turns for t in episode.trajectories), default=0)
        return await self._save(
            PartialEpisode(
                index=self.index, turns=turns, finished=episode, elapsed_s=self.elapsed()
            )
        )

    async def _save(self, partial: PartialEpisode) -> bool:
        self._last = self._clock()
        self.saves += 1
        return await self._send(partial)


class WorkflowError(AstraFlowError, RuntimeError):
    """A workflow that cannot run as configured (missing role, bad kwargs)."""
