"""The body of ``GET /status``: one document with everything the live views and the launcher need.

Built by the dataflow service (``astraflow.dataflow.ops.status``), read through the typed client by
the launcher's live view and ``astraflow status``. It lives here because it crosses a process
boundary.

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


class RegionNodes(StatusModel):
    """The active nodes of one region: live (heartbeat within the lease timeout) and silent."""

    active: int = 0
    silent: int = 0
    episodes: int = 0


class NodeSummary(StatusModel):
    """Every node of the run, counted: ``DataflowStatus.nodes`` lists a bounded number of them
    (a pool of thousands would make each status read megabytes), these figures count them all."""

    active: int = Field(default=0, description="Registered nodes with a recent heartbeat")
    silent: int = Field(default=0, description="Registered, no heartbeat within the lease timeout")
    left: int = Field(default=0, description="Nodes that deregistered or were replaced")
    listed: int = Field(default=0, description="Nodes in DataflowStatus.nodes")
    episodes: int = Field(default=0, description="Episodes pushed by every node, left ones too")
    episodes_per_s: float = 0.0
    active_leases: int = 0
    regions: dict[str, RegionNodes] = Field(default_factory=dict)


class ErrorSummary(StatusModel):
    """Failed episodes of one reason (``episode_error``, ``env_timeout``): how many, and the first
    and newest messages, so a view can say what went wrong without opening a node's log."""

    count: int
    first: str = ""
    last: str = ""


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
    filtered_rewards: dict[str, int] = Field(
        default_factory=dict,
        description="Groups a group filter dropped, by their reward mean (rounded to 3 places): "
        "one key means every dropped group had that one constant reward",
    )
    trainer_idle: float | None = Field(
        default=None,
        description="Fraction of the last TRAINER_IDLE_WINDOW_S (or since its first batch) the "
        "trainer had no batch to train; None before its first batch and once its steps are done",
    )
    cap_groups: int | None = Field(
        default=None,
        description="Admission cap: groups buffered plus in flight the service allows now "
        "(async mode with buffer_steps; None: unbounded or lock-step)",
    )


class DataflowStatus(StatusModel):
    run: str
    mode: str
    time: float
    done: bool
    training_done: bool
    stopped: str | None = Field(
        default=None, description="Why an admin stopped the run (POST /run/stop), if one did"
    )
    round: int | None = None
    queue: dict[str, int] = Field(description="Pending tasks: training per task set, and 'eval'")
    in_flight_leases: int
    training_in_flight: int = Field(
        default=0, description="Active leases of training tasks (one group each)"
    )
    expired_leases: int
    saved_episodes: int = Field(
        default=0,
        description="Episodes saved in flight (POST /partials) of tasks not done yet: what a "
        "node's death or drain hands to the task's next lease instead of playing it again",
    )
    tasks_done: int
    episodes: int
    episodes_per_s: float
    nodes: list[NodeStatus] = Field(
        description="The silent nodes, then the longest-registered active ones, at most "
        "STATUS_NODES_LISTED (256) of them, and the last nodes that left; node_summary counts all"
    )
    node_summary: NodeSummary = Field(default_factory=NodeSummary)
    policies: dict[str, PolicyStatus]
    evaluations: list[EvaluationResult]
    dataflow_policies: list[dict[str, str]]
    errors: dict[str, ErrorSummary] = Field(
        default_factory=dict,
        description="Failed episodes by reason, with the first and newest error message",
    )
    store: dict[str, Any] = Field(default_factory=dict)
    refused: dict[str, int] = Field(
        default_factory=dict,
        description="Requests answered 4xx since the service started, by 'STATUS METHOD "
        "/route: field' (a poisoning node's pushes show here; at most 256 reasons)",
    )
