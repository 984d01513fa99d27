"""The body of ``GET /status``: one document with everything the live views and the launcher need.

Built by the dataflow service (``astraflow.dataflow.status``), read through the typed client by the
launcher's live view and ``astraflow status``. It lives here because it crosses a process boundary.

Unlike the request/response bodies in :mod:`astraflow.protocol.messages`, unknown fields are
ignored, not rejected: status is read by people's tools, and a viewer one release behind must still
show a newer service's status.

The models also answer item access (``status["policies"]["policy"]["steps"]``, ``.get``): the
document was a plain dict for its first readers (scripts, tests, benchmarks), and they keep working.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from astraflow.protocol.messages import EvaluationResult


class StatusModel(BaseModel):
    """Read-only mapping access on top of attributes, for readers written against the dict."""

    def __getitem__(self, key: str) -> Any:
        if key not in type(self).model_fields:
            raise KeyError(key)
        return getattr(self, key)

    def __contains__(self, key: object) -> bool:
        return key in type(self).model_fields

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in type(self).model_fields else default


class NodeStatus(StatusModel):
    id: str
    name: str
    region: str
    state: str = Field(description="active, silent (no heartbeat within the lease timeout), left")
    last_heartbeat: float
    seconds_since_heartbeat: float
    versions: dict[str, int]
    episodes: int
    episodes_per_s: float
    active_leases: int
    metrics: dict[str, float] = Field(default_factory=dict)


class PolicyStatus(StatusModel):
    trainable: bool
    latest_version: int | None
    weight_location: str | None
    steps: int
    max_steps: int
    buffer_groups: int = Field(description="Complete groups waiting for a batch")
    buffer_samples: int
    unacked_batches: int
    staleness: dict[str, int] = Field(description="Histogram of sample staleness in acked batches")
    dropped: dict[str, int] = Field(description="Samples dropped, by reason")
    counters: dict[str, int] = Field(
        default_factory=dict,
        description="What dataflow policies did besides dropping (replayed samples/groups, ...)",
    )


class DataflowStatus(StatusModel):
    run: str
    mode: str
    time: float
    done: bool
    training_done: bool
    round: int | None = None
    queue: dict[str, int] = Field(description="Pending tasks: training per task set, and 'eval'")
    in_flight_leases: int
    expired_leases: int
    tasks_done: int
    episodes: int
    episodes_per_s: float
    nodes: list[NodeStatus]
    policies: dict[str, PolicyStatus]
    evaluations: list[EvaluationResult]
    dataflow_policies: list[dict[str, str]]
    store: dict[str, Any] = Field(default_factory=dict)
