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


class NodeRegistered(WireModel):
    node_id: str
    heartbeat_interval_s: float
    lease_timeout_s: float
    latest_versions: dict[str, int] = Field(default_factory=dict)
    max_lag: int


class Heartbeat(WireModel):
    versions: dict[str, int] = Field(default_factory=dict)
    in_flight: list[str] = Field(default_factory=list, description="Lease ids still being worked on")
    metrics: dict[str, float] = Field(default_factory=dict)


class HeartbeatReply(WireModel):
    latest_versions: dict[str, int] = Field(default_factory=dict)
    renewed: list[str] = Field(default_factory=list, description="Leases whose deadline was extended")
    lost: list[str] = Field(
        default_factory=list, description="Leases no longer held (expired and finished elsewhere)"
    )
    weight_locations: dict[str, str] = Field(default_factory=dict)
    stop: bool = Field(default=False, description="The run is over; the node should leave")


class LeaseRequest(WireModel):
    node_id: str
    max_tasks: int = Field(ge=1, le=4096)
    versions: dict[str, int] = Field(description="Weight version held per policy")


class LeaseGrant(WireModel):
    leases: list[Lease] = Field(default_factory=list)
    reason: str | None = Field(default=None, description="Why fewer tasks than asked were granted")
    latest_versions: dict[str, int] = Field(default_factory=dict)
    done: bool = Field(default=False, description="No task will ever be available again")


class LeaseRelease(WireModel):
    node_id: str
    lease_ids: list[str]


class TrajectoryPush(WireModel):
    idempotency_key: str = Field(default_factory=lambda: new_id("push"), min_length=8, max_length=128)
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


class BatchAck(WireModel):
    idempotency_key: str = Field(default_factory=lambda: new_id("ack"))
    trainer_version: int = Field(ge=0, description="Version produced by the step on this batch")
    metrics: dict[str, float] = Field(default_factory=dict)


class VersionAnnouncement(WeightVersion):
    pass


class Ack(WireModel):
    ok: bool = True
    detail: str | None = None
    at: float = Field(default_factory=time.time)
