"""Request and response bodies of the dataflow service's HTTP API.

Both the service and its clients (rollout nodes, trainers, the CLI) build these; the HTTP routes
themselves are documented in the service's OpenAPI document.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import Field

from astraflow.protocol.models import Batch, Episode, Lease, WeightVersion, WireModel, new_id


class NodeRegistration(WireModel):
    name: str = Field(default="", max_length=256, description="Human-readable node name")
    policies: dict[str, int] = Field(description="Policies served and the weight version held")
    concurrency: int = Field(default=8, ge=1, le=65536)
    region: str = Field(default="local", max_length=128)
    engines: dict[str, str] = Field(default_factory=dict, description="Engine kind per policy")
    meta: dict[str, Any] = Field(default_factory=dict)
    replace: bool = Field(
        default=False,
        description=(
            "This node restarts a crashed one of the same name: a registered node with this name "
            "that has been silent for more than two heartbeat intervals leaves now and its leases "
            "go back to the queue (instead of when they time out)"
        ),
    )


class NodeRegistered(WireModel):
    node_id: str
    heartbeat_interval_s: float
    lease_timeout_s: float
    latest_versions: dict[str, int] = Field(default_factory=dict)
    max_lag: int


class Heartbeat(WireModel):
    versions: dict[str, int] = Field(default_factory=dict)
    in_flight: list[str] = Field(
        default_factory=list, description="Lease ids still being worked on"
    )
    metrics: dict[str, float] = Field(default_factory=dict)


class HeartbeatReply(WireModel):
    latest_versions: dict[str, int] = Field(default_factory=dict)
    renewed: list[str] = Field(
        default_factory=list, description="Leases whose deadline was extended"
    )
    lost: list[str] = Field(
        default_factory=list, description="Leases no longer held (expired and finished elsewhere)"
    )
    weight_locations: dict[str, str] = Field(default_factory=dict)
    stop: bool = Field(default=False, description="The run is over; the node should leave")


class LeaseRequest(WireModel):
    node_id: str
    max_tasks: int = Field(ge=1, le=4096)
    versions: dict[str, int] = Field(description="Weight version held per policy")
    idempotency_key: str | None = Field(
        default=None, max_length=128, description="A retry with the same key gets the same leases"
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
    update_first: bool = Field(
        default=False,
        description="The node's training work is held back until it loads the latest weights "
        "(more than max_lag behind, a sync round, or a rewound timeline): ask again once loaded",
    )


class LeaseRelease(WireModel):
    node_id: str
    lease_ids: list[str]


class TrajectoryPush(WireModel):
    idempotency_key: str = Field(
        default_factory=lambda: new_id("push"), min_length=8, max_length=128
    )
    node_id: str
    lease_id: str
    episodes: list[Episode] = Field(max_length=1024)


class PushResult(WireModel):
    accepted: bool
    duplicate: bool = Field(default=False, description="Same idempotency key seen before")
    reason: str | None = None
    samples: int = 0


class BatchRequest(WireModel):
    policy: str
    num_groups: int = Field(ge=1, le=65536)
    trainer_version: int = Field(ge=0)
    trainer_id: str = "trainer"
    wait_s: float = Field(default=0.0, ge=0.0, le=600.0, description="Long-poll up to this long")


class BatchReply(WireModel):
    batch: Batch | None = None
    reason: str | None = None
    done: bool = Field(default=False, description="No more data will arrive for this policy")
    redelivered: bool = Field(
        default=False, description="This batch was served before and never acknowledged"
    )


class BatchAck(WireModel):
    idempotency_key: str = Field(default_factory=lambda: new_id("ack"))
    trainer_version: int = Field(ge=0, description="Version produced by the step on this batch")
    metrics: dict[str, float] = Field(default_factory=dict)
    trained: bool = Field(
        default=True,
        description=(
            "False: consumed without an optimizer step (nothing in it was trainable); the batch "
            "is done with but is not a step of the run"
        ),
    )
    checkpoint_version: int | None = Field(
        default=None,
        ge=0,
        description=(
            "Newest version the trainer can restart from (its newest complete checkpoint; 0: "
            "the initial weights). The service keeps the samples of later steps so that a "
            "restarted trainer is served the same batches again; None: the trainer cannot "
            "resume, and samples are freed as soon as their step is acknowledged"
        ),
    )


class VersionAnnouncement(WeightVersion):
    pass


class EvaluationRequest(WireModel):
    """Ask rollout nodes to evaluate ``policy`` at ``version`` (or newer) on held-out tasks."""

    idempotency_key: str = Field(
        default_factory=lambda: new_id("eval"), min_length=8, max_length=128
    )
    policy: str = Field(min_length=1, max_length=128)
    version: int = Field(ge=0, description="Nodes must hold at least this version")
    step: int | None = Field(default=None, ge=0, description="Trainer step (defaults to version)")
    task_set: str | None = Field(default=None, max_length=128, description="Default: recipe's")
    split: str | None = Field(default=None, max_length=64, description="Default: recipe's")
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
