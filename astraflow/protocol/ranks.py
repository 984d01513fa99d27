"""What rank 0 of a multi-process trainer hands the other ranks each step (between the ranks of
one trainer: a process boundary like any other, so msgpack and the protocol codec, never pickle)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from astraflow.protocol.codec import decode, decode_obj, encode, encode_obj
from astraflow.protocol.models import Batch

PayloadKind = Literal["ok", "exhausted", "error"]


@dataclass(frozen=True)
class RankPayload:
    """What rank 0 got from the batch source: a batch, the end of the data, or a failure."""

    kind: PayloadKind
    batch: Batch | None = None
    message: str = ""

    def to_bytes(self) -> bytes:
        return encode_obj(
            {
                "kind": self.kind,
                "message": self.message,
                "batch": encode(self.batch) if self.batch is not None else None,
            }
        )

    @classmethod
    def from_bytes(cls, body: bytes) -> RankPayload:
        raw = decode_obj(body)
        if not isinstance(raw, dict) or raw.get("kind") not in ("ok", "exhausted", "error"):
            raise ValueError("rank payload is not a {kind, message, batch} map")
        batch = raw.get("batch")
        return cls(
            kind=raw["kind"],
            message=str(raw.get("message") or ""),
            # already size-checked when the dataflow's answer was decoded on rank 0
            batch=decode(Batch, batch, max_bytes=len(batch)) if batch is not None else None,
        )
