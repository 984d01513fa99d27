"""Types and encodings shared by every AstraFlow component (the only shared code between them)."""

from astraflow.protocol.codec import JSON, MSGPACK, DecodeError, decode, encode
from astraflow.protocol.messages import (
    Ack,
    BatchAck,
    BatchReply,
    BatchRequest,
    Heartbeat,
    HeartbeatReply,
    LeaseGrant,
    LeaseRelease,
    LeaseRequest,
    NodeRegistered,
    NodeRegistration,
    PushResult,
    TrajectoryPush,
    VersionAnnouncement,
)
from astraflow.protocol.models import (
    Batch,
    Episode,
    Group,
    Lease,
    Sample,
    Task,
    Trajectory,
    WeightVersion,
    new_id,
)

__all__ = [
    "JSON", "MSGPACK", "DecodeError", "decode", "encode",
    "Ack", "BatchAck", "BatchReply", "BatchRequest", "Heartbeat", "HeartbeatReply", "LeaseGrant",
    "LeaseRelease", "LeaseRequest", "NodeRegistered", "NodeRegistration", "PushResult",
    "TrajectoryPush", "VersionAnnouncement",
    "Batch", "Episode", "Group", "Lease", "Sample", "Task", "Trajectory", "WeightVersion", "new_id",
]
