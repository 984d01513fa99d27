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

from pydantic import BaseModel, ConfigDict, Field, model_validator

from astraflow.protocol.arrays import MAX_ARRAY_ITEMS, FloatArray, IntArray, TokenArray

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


def _check_token_arrays(model: Trajectory | Sample) -> None:
    """Per-token arrays must align with ``tokens`` and the loss mask must be 0/1.

    Shared by Trajectory and Sample: a misaligned sample would silently train on the wrong tokens.
    """
    n = len(model.tokens)
    for name in ("loss_mask", "logprobs", "versions"):
        if len(getattr(model, name)) != n:
            raise ValueError(
                f"{name} has {len(getattr(model, name))} entries but tokens has {n}; "
                "per-token arrays must align with tokens"
            )
    if any(m not in (0, 1) for m in model.loss_mask):
        raise ValueError("loss_mask must contain only 0 and 1")


class Trajectory(WireModel):
    """What one role saw and did in an episode, as one growing token sequence.

    ``loss_mask`` is 1 exactly on tokens this role's policy generated; ``logprobs`` and ``versions``
    are meaningful only there (0.0 and -1 elsewhere). Other roles' text appears as context tokens.
    """

    role: str = Field(min_length=1, max_length=128)
    tokens: TokenArray = Field(max_length=MAX_SEQUENCE_TOKENS)
    loss_mask: IntArray = Field(max_length=MAX_SEQUENCE_TOKENS)
    logprobs: FloatArray = Field(max_length=MAX_SEQUENCE_TOKENS)
    versions: IntArray = Field(max_length=MAX_SEQUENCE_TOKENS)
    num_turns: int = Field(default=1, ge=0)

    @model_validator(mode="after")
    def _aligned(self) -> Trajectory:
        _check_token_arrays(self)
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

    id: str = Field(default_factory=lambda: new_id("ep"))
    task_id: str
    trajectories: list[Trajectory] = Field(default_factory=list, max_length=64)
    rewards: dict[str, float] = Field(default_factory=dict, description="Reward per role")
    #: ``error``: the workflow or env raised; ``env_timeout``: an env call ran past
    #: ``rollout.env_timeout_s`` (both carry ``error`` and yield no sample)
    finish_reason: Literal[
        "terminated", "truncated", "turn_limit", "length", "error", "env_timeout"
    ] = "terminated"
    error: str | None = Field(default=None, max_length=8192)
    info: dict[str, Any] = Field(default_factory=dict)
    metrics: dict[str, float] = Field(default_factory=dict, description="Timings and counters")

    @model_validator(mode="after")
    def _roles_have_rewards(self) -> Episode:
        if self.error is None:
            missing = {t.role for t in self.trajectories} - set(self.rewards)
            if missing:
                raise ValueError(f"rewards missing for roles {sorted(missing)}")
        return self


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

    @model_validator(mode="after")
    def _aligned(self) -> Sample:
        _check_token_arrays(self)
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
    version: int = Field(ge=0)
    location: str = Field(description="Weight store URL or directory holding this version")
    digest: str = Field(description="sha256 of the canonical state (see astraflow.weights)")
    parent: int | None = Field(default=None, description="Version a delta applies to, if any")
    full_bytes: int = 0
    delta_bytes: int | None = None
    created_at: float = Field(default_factory=time.time)
