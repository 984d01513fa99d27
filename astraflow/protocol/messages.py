"""Request and response bodies of the dataflow service's HTTP API.

Both the service and its clients (rollout nodes, trainers, the CLI) build these; the HTTP routes
themselves are documented in the service's OpenAPI document.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field

from astraflow.protocol.arrays import Problem, vocab_problem
from astraflow.protocol.bounds import (
    INT64_MAX,
    MAX_IN_FLIGHT,
    MAX_METRIC_KEYS,
    MAX_POLICIES,
    Finite,
    Name,
    Tree,
    Version,
    text,
)
from astraflow.protocol.models import (
    MAX_GROUP_SIZE,
    Batch,
    Episode,
    Lease,
    PartialEpisode,
    WeightVersion,
    WireModel,
    new_id,
)

#: A weight version a node holds (-1: none loaded yet).
HeldVersion = Annotated[int, Field(ge=-1, le=INT64_MAX)]
#: Longest idempotency key.
MAX_KEY_CHARS = 128
IdempotencyKey = text(MAX_KEY_CHARS)

#: The metric keys a rollout node may report in its heartbeats (``NodeStats.as_metrics``); the
#: service keeps only these (others are dropped and counted as ``dropped_metric_keys``), so
#: metrics.jsonl and /status stay bounded whatever a node sends.
NODE_METRIC_KEYS = frozenset(
    {
        "episodes",
        "errors",
        "env_timeouts",
        "pushes",
        "episodes_per_s",
        "tokens_per_s",
        "weight_updates",
        "weight_fetch_s",
        "weight_load_s",
        "weight_sync_s",
        "weight_sync_s_mean",
        "episode_saves",
    }
)


class NodeRegistration(WireModel):
    name: Name = Field(default="", description="Human-readable node name")
    policies: dict[Name, HeldVersion] = Field(
        max_length=MAX_POLICIES, description="Policies served and the weight version held"
    )
    concurrency: int = Field(default=8, ge=1, le=65536)
    region: text(128) = "local"
    engines: dict[Name, text(128)] = Field(
        default_factory=dict, max_length=MAX_POLICIES, description="Engine kind per policy"
    )
    meta: Tree = Field(default_factory=dict)
    replace: bool = Field(
        default=False,
        description=(
            "This node restarts a crashed one of the same name: a registered node with this name "
            "that has been silent for more than two heartbeat intervals leaves now and its leases "
            "go back to the queue (instead of when they time out)"
        ),
    )


#: Header carrying a node's own credential (``NodeRegistered.node_key``) where one is needed.
NODE_KEY_HEADER = "x-node-key"


class NodeRegistered(WireModel):
    node_id: str
    node_key: str = Field(
        default="",
        description="This node's own credential: sent as the X-Node-Key header, it lets the node "
        "deregister itself (a node token alone may not deregister a node)",
    )
    heartbeat_interval_s: float
    lease_timeout_s: float
    latest_versions: dict[str, int] = Field(default_factory=dict)
    max_lag: int
    group_size: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Episodes per training task: a node leases a group only while it fits the node's "
            "free episode slots (rollout.concurrency counts episodes)"
        ),
    )


class Heartbeat(WireModel):
    versions: dict[Name, HeldVersion] = Field(default_factory=dict, max_length=MAX_POLICIES)
    in_flight: list[Name] = Field(
        default_factory=list,
        max_length=MAX_IN_FLIGHT,
        description="Lease ids still being worked on",
    )
    metrics: dict[Name, Finite] = Field(
        default_factory=dict,
        max_length=MAX_METRIC_KEYS,
        description="Node counters; only the keys of NODE_METRIC_KEYS are kept",
    )


class HeartbeatReply(WireModel):
    latest_versions: dict[str, int] = Field(default_factory=dict)
    renewed: list[str] = Field(
        default_factory=list, description="Leases whose deadline was extended"
    )
    lost: list[str] = Field(
        default_factory=list, description="Leases no longer held (expired and finished elsewhere)"
    )
    weight_locations: dict[str, str] = Field(default_factory=dict)
    weight_digests: dict[str, str] = Field(
        default_factory=dict,
        description="Digest of the latest version of each policy: a node holding that version "
        "number with another digest (it missed a rewind) reloads",
    )
    stop: bool = Field(default=False, description="The run is over; the node should leave")
    heartbeat_interval_s: float | None = Field(
        default=None,
        gt=0.0,
        description="The interval the service asks for now (it grows with the pool, see "
        "dataflow.max_heartbeats_per_s); None: keep the registration's",
    )


class LeaseRequest(WireModel):
    node_id: Name
    max_tasks: int = Field(ge=1, le=4096)
    max_episodes: int | None = Field(
        default=None,
        ge=1,
        le=1 << 20,
        description=(
            "Episode slots the node has free: the granted tasks' group sizes add up to at most "
            "this (None: only max_tasks bounds the grant)"
        ),
    )
    versions: dict[Name, HeldVersion] = Field(
        max_length=MAX_POLICIES, description="Weight version held per policy"
    )
    idempotency_key: IdempotencyKey | None = Field(
        default=None,
        description="A retry with the same key gets the same leases (keys are per node)",
    )
    wait_s: float = Field(
        default=0.0,
        ge=0.0,
        le=600.0,
        description=(
            "Long-poll: when nothing may be leased now, wait at the service up to this long for "
            "work this node may take (answered at once when it appears), then reply empty"
        ),
    )


class LeaseGrant(WireModel):
    leases: list[Lease] = Field(default_factory=list)
    reason: str | None = Field(default=None, description="Why fewer tasks than asked were granted")
    latest_versions: dict[str, int] = Field(default_factory=dict)
    done: bool = Field(default=False, description="No task will ever be available again")
    weight_locations: dict[str, str] = Field(
        default_factory=dict, description="Where the latest version of each policy can be fetched"
    )
    weight_digests: dict[str, str] = Field(
        default_factory=dict,
        description="Digest of the latest version of each policy (see HeartbeatReply)",
    )
    update_first: bool = Field(
        default=False,
        description="The node's training work is held back until it loads the latest weights "
        "(more than max_lag behind, a sync round, or a rewound timeline): ask again once loaded",
    )


class LeaseRelease(WireModel):
    node_id: Name
    lease_ids: list[Name] = Field(max_length=MAX_IN_FLIGHT)


class TrajectoryPush(WireModel):
    idempotency_key: IdempotencyKey = Field(
        default_factory=lambda: new_id("push"),
        min_length=8,
        description="Per node: a retry with the same key and body gets the first answer; "
        "the same key with another body is 409",
    )
    node_id: Name
    lease_id: Name
    episodes: list[Episode] = Field(max_length=1024)

    def policy_problem(
        self,
        policy_of_role: Mapping[str, str],
        facts: Mapping[str, PolicyFacts],
        packed_tokens: Mapping[tuple[int, int], Any] | None = None,
    ) -> Problem | None:
        """(field, what is wrong) when a trajectory's tokens do not fit its policy's model
        (vocabulary, context length), else None: the push's one semantic check, made by the
        service with what it learned from the trainers (:class:`PolicyFacts`).

        ``packed_tokens``: token arrays of trajectories that arrived packed (their list field
        is empty), keyed (episode, trajectory)."""
        packed_tokens = packed_tokens or {}
        for i, ep in enumerate(self.episodes):
            for j, tr in enumerate(ep.trajectories):
                fact = facts.get(policy_of_role.get(tr.role, ""))
                if fact is None:
                    continue
                tokens = packed_tokens.get((i, j), tr.tokens)
                problem = vocab_problem(tokens, fact.vocab_size, fact.context_length)
                if problem is not None:
                    return Problem(
                        f"episodes.{i}.trajectories.{j}.tokens", f"episode {ep.id!r}: {problem}"
                    )
        return None


class PartialPush(WireModel):
    """``POST /partials``: a node saves episodes of a lease it holds that are still in flight
    (:class:`~astraflow.protocol.models.PartialEpisode`), so that if it dies the task's next lease
    resumes them. Each save of an episode replaces the previous one."""

    node_id: Name
    lease_id: Name
    partials: list[PartialEpisode] = Field(min_length=1, max_length=MAX_GROUP_SIZE)

    def policy_problem(
        self, policy_of_role: Mapping[str, str], facts: Mapping[str, PolicyFacts]
    ) -> Problem | None:
        """(field, what is wrong) when a saved trajectory's tokens do not fit its policy's model,
        else None: the same check as a push's (:meth:`TrajectoryPush.policy_problem`)."""
        for i, partial in enumerate(self.partials):
            for j, tr in enumerate(partial.all_trajectories):
                fact = facts.get(policy_of_role.get(tr.role, ""))
                if fact is None:
                    continue
                problem = vocab_problem(tr.tokens, fact.vocab_size, fact.context_length)
                if problem is not None:
                    return Problem(f"partials.{i}.trajectories.{j}.tokens", problem)
        return None


class PartialResult(WireModel):
    accepted: bool
    reason: str | None = None
    #: episodes whose saved state is now the one this push carried
    stored: int = 0


@dataclass(frozen=True)
class PolicyFacts:
    """What the service knows of a policy's model, from the trainer's version announcements."""

    vocab_size: int | None = None
    context_length: int | None = None


class PushResult(WireModel):
    accepted: bool
    duplicate: bool = Field(default=False, description="Same idempotency key seen before")
    reason: str | None = None
    samples: int = 0


class BatchRequest(WireModel):
    policy: Name
    num_groups: int = Field(ge=1, le=65536)
    trainer_version: Version
    trainer_id: Name = "trainer"
    wait_s: float = Field(default=0.0, ge=0.0, le=600.0, description="Long-poll up to this long")


class BatchReply(WireModel):
    batch: Batch | None = None
    reason: str | None = None
    done: bool = Field(default=False, description="No more data will arrive for this policy")
    redelivered: bool = Field(
        default=False, description="This batch was served before and never acknowledged"
    )


class BatchAck(WireModel):
    idempotency_key: IdempotencyKey = Field(default_factory=lambda: new_id("ack"))
    trainer_version: Version = Field(description="Version produced by the step on this batch")
    metrics: dict[Name, float] = Field(default_factory=dict, max_length=4096)
    trained: bool = Field(
        default=True,
        description=(
            "False: consumed without an optimizer step (nothing in it was trainable); the batch "
            "is done with but is not a step of the run"
        ),
    )
    invalid_samples: dict[Name, text(2048)] = Field(
        default_factory=dict,
        max_length=65_536,
        description="Samples the trainer quarantined (id -> why): not trained on; the service "
        "counts them as dropped 'invalid_sample' and names the nodes that sent them",
    )
    checkpoint_version: Version | None = Field(
        default=None,
        description=(
            "Newest version the trainer can restart from (its newest complete checkpoint; 0: "
            "the initial weights). The service keeps the samples of later steps so that a "
            "restarted trainer is served the same batches again; None: the trainer cannot "
            "resume, and samples are freed as soon as their step is acknowledged"
        ),
    )


class VersionAnnouncement(WeightVersion):
    pass


class RunStop(WireModel):
    """``POST /run/stop`` (admin): end the run now. Trainers checkpoint and leave, nodes finish or
    hand back their episodes and leave, the launcher ends."""

    reason: str = Field(default="stopped by an admin", max_length=500)


class LatestVersions(WireModel):
    """The version table's newest row per policy (``GET /versions/latest``): where a region's
    weight cache finds each policy's current weight server after a trainer restart."""

    versions: dict[str, WeightVersion] = Field(default_factory=dict)


class EvaluationRequest(WireModel):
    """Ask rollout nodes to evaluate ``policy`` at ``version`` (or newer) on held-out tasks."""

    idempotency_key: IdempotencyKey = Field(default_factory=lambda: new_id("eval"), min_length=8)
    policy: Name = Field(min_length=1, max_length=128)
    version: Version = Field(description="Nodes must hold at least this version")
    step: Version | None = Field(default=None, description="Trainer step (defaults to version)")
    task_set: text(128) | None = Field(default=None, description="Default: recipe's")
    split: text(64) | None = Field(default=None, description="Default: recipe's")
    num_tasks: int | None = Field(default=None, ge=1, le=100_000, description="Default: recipe's")


class EvaluationResult(WireModel):
    """Progress and outcome of one evaluation (accuracy = mean reward of the policy's roles)."""

    id: str
    policy: str
    version: int
    step: int
    task_set: str
    split: str
    num_tasks: int
    completed: int = 0
    errors: int = Field(default=0, description="Episodes that ended in an error (scored 0)")
    accuracy: float | None = None
    done: bool = False
    created_at: float = 0.0
    finished_at: float | None = None


class EvaluationList(WireModel):
    evaluations: list[EvaluationResult] = Field(default_factory=list)


class Ack(WireModel):
    ok: bool = True
    detail: str | None = None
    at: float = Field(default_factory=time.time)
