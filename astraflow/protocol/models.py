"""The data model every component shares: tasks, leases, episodes, samples, groups, batches, versions.

These, with the bodies in ``messages``, ``status`` and ``weights``, are the only types that cross
component boundaries (see docs/architecture.md, "Data model").
Token-in/token-out: sequences are token ids produced by the rollout engine; the trainer never
re-tokenizes text, so the behaviour log-probs always refer to the tokens it trains on.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator

from astraflow.protocol.arrays import (
    CHECKED,
    MAX_ARRAY_ITEMS,
    FloatArray,
    IntArray,
    TokenArray,
    token_array_problem,
    turn_rewards_problem,
)
from astraflow.protocol.bounds import (
    MAX_METRIC_KEYS,
    Finite,
    Int64,
    Name,
    Tree,
    Version,
    text,
)

#: Longest token sequence accepted anywhere on the wire (prompt + all turns).
MAX_SEQUENCE_TOKENS = MAX_ARRAY_ITEMS
#: Largest group a task may ask for.
MAX_GROUP_SIZE = 1024


def new_id(prefix: str) -> str:
    """A short unique id with a readable prefix (``task-3f2a…``)."""
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


class WireModel(BaseModel):
    """Base for wire types: unknown fields are rejected so typos fail loudly at the boundary."""

    # ser_json_inf_nan="constants": a log-prob of -inf must survive JSON as it survives msgpack
    # (the default would write null, which then fails validation on the other side).
    model_config = ConfigDict(
        extra="forbid", frozen=False, validate_assignment=False, ser_json_inf_nan="constants"
    )


class Task(WireModel):
    """One unit of work: an environment, its task payload and the workflow that runs it."""

    id: str = Field(default_factory=lambda: new_id("task"), min_length=1, max_length=256)
    env: str = Field(
        min_length=1, max_length=256, description="Registered env id, e.g. astraflow/Math-v0"
    )
    payload: dict[str, Any] = Field(
        default_factory=dict, description="Task payload passed to env.reset"
    )
    workflow: str = Field(default="single_agent", min_length=1, max_length=128)
    group_size: int = Field(default=1, ge=1, le=MAX_GROUP_SIZE)
    task_set: str = Field(
        default="default", max_length=128, description="Task set the task came from"
    )
    priority: float = 0.0
    deadline: float | None = Field(
        default=None, description="Unix time; earliest-deadline-first ordering"
    )
    meta: dict[str, Any] = Field(default_factory=dict)


def _check_token_arrays(model: Trajectory | Sample) -> None:
    """The per-token arrays' rules (:func:`astraflow.protocol.arrays.token_array_problem`).

    Shared by Trajectory and Sample: a misaligned sample would silently train on the wrong tokens.
    """
    problem = token_array_problem(model.tokens, model.loss_mask, model.logprobs, model.versions)
    if problem is not None:
        raise ValueError(f"{problem.field}: {problem.message}")


class Trajectory(WireModel):
    """What one role saw and did in an episode, as one growing token sequence.

    ``loss_mask`` is 1 exactly on tokens this role's policy generated; ``logprobs`` and ``versions``
    are meaningful only there (0.0 and -1 elsewhere). Other roles' text appears as context tokens.
    """

    role: Name = Field(min_length=1, max_length=128)
    tokens: TokenArray = Field(max_length=MAX_SEQUENCE_TOKENS)
    loss_mask: IntArray = Field(max_length=MAX_SEQUENCE_TOKENS)
    logprobs: FloatArray = Field(max_length=MAX_SEQUENCE_TOKENS)
    versions: IntArray = Field(max_length=MAX_SEQUENCE_TOKENS)
    num_turns: int = Field(default=1, ge=0, le=1_000_000)
    #: the reward of each generated turn (each run of loss mask 1), in order, when the workflow
    #: kept them (``trainer.turn_discount`` credits each turn with its own return); None: the
    #: episode's reward only
    turn_rewards: list[Finite] | None = Field(default=None, max_length=MAX_SEQUENCE_TOKENS)

    @model_validator(mode="after")
    def _aligned(self, info: ValidationInfo) -> Trajectory:
        if not (info.context and info.context.get(CHECKED) and not self.tokens):
            _check_token_arrays(self)
            problem = turn_rewards_problem(self.turn_rewards, self.loss_mask)
            if problem is not None:
                raise ValueError(f"{problem.field}: {problem.message}")
        return self

    @property
    def prompt_length(self) -> int:
        """Index of the first generated token (everything before it is the prompt)."""
        for i, m in enumerate(self.loss_mask):
            if m:
                return i
        return len(self.tokens)


class Episode(WireModel):
    """One run of a workflow on one task: per-role trajectories and rewards."""

    id: Name = Field(default_factory=lambda: new_id("ep"), min_length=1)
    task_id: Name
    trajectories: list[Trajectory] = Field(default_factory=list, max_length=64)
    rewards: dict[Name, Finite] = Field(
        default_factory=dict, max_length=64, description="Reward per role (finite)"
    )
    #: ``error``: the workflow or env raised; ``env_timeout``: an env call ran past
    #: ``rollout.env_timeout_s`` (both carry ``error`` and yield no sample);
    #: ``invalid_tool_call``: the policy wrote a tool call that did not parse (a scored outcome)
    finish_reason: Literal[
        "terminated",
        "truncated",
        "turn_limit",
        "length",
        "error",
        "env_timeout",
        "invalid_tool_call",
    ] = "terminated"
    error: text(8192) | None = None
    info: Tree = Field(default_factory=dict)
    metrics: dict[Name, Finite] = Field(
        default_factory=dict, max_length=MAX_METRIC_KEYS, description="Timings and counters"
    )

    @model_validator(mode="after")
    def _roles_have_rewards(self) -> Episode:
        if self.error is None:
            missing = {t.role for t in self.trajectories} - set(self.rewards)
            if missing:
                raise ValueError(f"rewards missing for roles {sorted(missing)}")
        return self


class PartialEpisode(WireModel):
    """An episode in flight, saved by its node after a finished turn, so that another node can
    finish it if this one dies (``POST /partials``; handed back on the task's next lease).

    ``trajectories`` hold every role's sequence so far, with the behaviour log-probs and versions
    of the tokens already generated: a node that resumes keeps them as they are and generates only
    the turns that follow. ``env_state`` is the env's ``state_dict()`` (None: the env cannot save
    one, and the episode is played again from the start); ``workflow_state`` is what the workflow
    itself needs to go on (its turn rewards, the last env info), opaque to the service.
    ``finished``: the episode ended on its node but its group was not pushed yet (a group is
    pushed whole); a node that takes the task over plays it again (its rewards and id were the
    saving node's word, see ``astraflow.rollout.node.trusted_saves``)."""

    #: which of the task's ``group_size`` episodes this is (the node's own numbering, 0-based)
    index: int = Field(ge=0, lt=MAX_GROUP_SIZE)
    #: finished turns saved (a newer save of the same episode replaces an older one)
    turns: int = Field(ge=0, le=1_000_000)
    trajectories: list[Trajectory] = Field(default_factory=list, max_length=64)
    env_state: Tree | None = None
    workflow_state: Tree = Field(default_factory=dict)
    finished: Episode | None = None
    #: seconds the episode had run when saved (on every node that played it)
    elapsed_s: Finite = Field(default=0.0, ge=0.0)

    @model_validator(mode="after")
    def _has_turns(self) -> PartialEpisode:
        if self.finished is None and not self.trajectories:
            raise ValueError("a saved episode needs its trajectories or the finished episode")
        return self

    @property
    def all_trajectories(self) -> list[Trajectory]:
        """Every trajectory it carries (the saved turns' and the finished episode's)."""
        return [*self.trajectories, *(self.finished.trajectories if self.finished else ())]


class Lease(WireModel):
    """A task handed to a rollout node until ``deadline`` (unix seconds)."""

    id: str = Field(default_factory=lambda: new_id("lease"))
    task: Task
    node_id: str
    deadline: float
    issued_at: float = Field(default_factory=time.time)
    versions: dict[str, int] = Field(
        default_factory=dict, description="Weight version per policy the node held when leased"
    )
    partials: list[PartialEpisode] = Field(
        default_factory=list,
        max_length=MAX_GROUP_SIZE,
        description="Episodes of this task a previous lease saved in flight (POST /partials): "
        "the node resumes each from its saved turn instead of playing it from the start",
    )


class Sample(WireModel):
    """What a trainer consumes: one policy's view of one episode."""

    id: str = Field(default_factory=lambda: new_id("smp"))
    policy: str
    role: str
    task_id: str
    episode_id: str
    group_id: str
    tokens: TokenArray = Field(max_length=MAX_SEQUENCE_TOKENS)
    loss_mask: IntArray = Field(max_length=MAX_SEQUENCE_TOKENS)
    logprobs: FloatArray = Field(max_length=MAX_SEQUENCE_TOKENS)
    versions: IntArray = Field(max_length=MAX_SEQUENCE_TOKENS)
    reward: float
    advantage: float = 0.0
    weight: float = Field(default=1.0, ge=0.0, description="Loss weight (staleness down-weighting)")
    #: the trajectory's per-turn rewards (see :attr:`Trajectory.turn_rewards`), or None
    turn_rewards: list[Finite] | None = Field(default=None, max_length=MAX_SEQUENCE_TOKENS)

    @model_validator(mode="after")
    def _aligned(self) -> Sample:
        _check_token_arrays(self)
        problem = turn_rewards_problem(self.turn_rewards, self.loss_mask)
        if problem is not None:
            raise ValueError(f"{problem.field}: {problem.message}")
        return self

    @property
    def prompt_length(self) -> int:
        for i, m in enumerate(self.loss_mask):
            if m:
                return i
        return len(self.tokens)

    @property
    def min_version(self) -> int:
        """Oldest weight version among the generated tokens (-1 if none were generated)."""
        gen = [v for v, m in zip(self.versions, self.loss_mask, strict=True) if m]
        return min(gen) if gen else -1


class Group(WireModel):
    """Samples of one task for one policy: the unit of GRPO advantages and of filtering."""

    id: str
    task_id: str
    policy: str
    task_set: str = "default"
    samples: list[Sample] = Field(max_length=MAX_GROUP_SIZE)
    reward_mean: float = 0.0
    reward_std: float = 0.0


class Batch(WireModel):
    """Groups served to one trainer; acknowledged after the optimizer step commits."""

    id: str
    policy: str
    trainer_version: int
    groups: list[Group]
    dropped: dict[str, int] = Field(default_factory=dict, description="Samples dropped by reason")

    @property
    def samples(self) -> list[Sample]:
        return [s for g in self.groups for s in g.samples]


class WeightVersion(WireModel):
    """A published weight version of one policy, as announced to the dataflow service."""

    policy: str
    version: Version
    location: text(4096) = Field(description="Weight store URL or directory holding this version")
    digest: Name = Field(description="sha256 of the canonical state (see astraflow.weights)")
    parent: Version | None = Field(default=None, description="Version a delta applies to, if any")
    full_bytes: Int64 = 0
    delta_bytes: Int64 | None = None
    vocab_size: int | None = Field(
        default=None,
        ge=1,
        le=2**31 - 1,
        description="Rows of the model's embedding: token ids a node pushes must be below it "
        "(the dataflow service learns it from the trainer's announcements)",
    )
    context_length: int | None = Field(
        default=None,
        ge=1,
        le=2**31 - 1,
        description="Longest sequence the model takes (prompt + completion), if it has a limit",
    )
    created_at: float = Field(default_factory=time.time)
