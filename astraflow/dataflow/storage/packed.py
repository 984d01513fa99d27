"""Fast decoding of trajectory pushes whose token arrays are packed (the msgpack wire format).

Why: a push of one 1-4k-token episode is ~40 KB of per-token arrays. Expanding them into Python
lists for pydantic and packing them back into bytes for SQLite cost about 1 ms of CPU per push, most
of the service's time under load. Here the packed arrays are checked with numpy instead (same rules
as :class:`astraflow.protocol.Trajectory`: whole items, aligned lengths, 0/1 loss mask, length
limit) and stored as they arrived, while every other field still goes through pydantic. A 422
names the offending field exactly as the pydantic path would.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import msgpack
import numpy as np

from astraflow.protocol import TrajectoryPush
from astraflow.protocol.arrays import (
    CHECKED,
    MAX_ARRAY_ITEMS,
    token_array_problem,
    turn_rewards_problem,
)
from astraflow.protocol.codec import BodyTooLarge, DecodeError, validate

ARRAY_FIELDS = (("tokens", "<i4"), ("loss_mask", "<i4"), ("logprobs", "<f4"), ("versions", "<i4"))


@dataclass
class PackedArrays:
    """One trajectory's per-token arrays in their stored form, plus what ingestion needs.

    Tokens and log-probs are the little-endian bytes as they arrived. Loss mask and versions are
    runs of a few values, so they are stored zlib-compressed (~40x smaller, halving the bytes
    written per sample); :func:`unstore` reverses this. The compression happens here, when the push
    is decoded on the request's thread, not in the ingest transaction: the store's one writer
    thread serialises every operation of the service, and zlib was a third of its CPU per push."""

    tokens: bytes
    loss_mask_z: bytes
    logprobs: bytes
    versions_z: bytes
    n_tokens: int
    min_version: int
    max_version: int
    #: the loss mask as it arrived (numpy view; the per-turn rewards are checked against it)
    mask: np.ndarray | None = None

    def stored(self) -> tuple[bytes, bytes, bytes, bytes]:
        """The arrays as stored in SQLite (tokens, loss_mask, logprobs, versions columns)."""
        return self.tokens, self.loss_mask_z, self.logprobs, self.versions_z

    @classmethod
    def from_lists(cls, tokens, loss_mask, logprobs, versions) -> PackedArrays:
        t = np.asarray(tokens, dtype="<i4")
        m = np.asarray(loss_mask, dtype="<i4")
        v = np.asarray(versions, dtype="<i4")
        return cls._build(t, m, np.asarray(logprobs, dtype="<f4"), v)

    @classmethod
    def _build(cls, t, m, lp, v, received: dict[str, bytes] | None = None) -> PackedArrays:
        """``received``: the arrays' bytes as they arrived, kept as they are (no copy)."""
        gen = v[m == 1]
        raw = received or {}
        return cls(
            tokens=raw.get("tokens") or t.tobytes(),
            loss_mask_z=zlib.compress(raw.get("loss_mask") or m.tobytes(), 1),
            logprobs=raw.get("logprobs") or lp.tobytes(),
            versions_z=zlib.compress(raw.get("versions") or v.tobytes(), 1),
            n_tokens=int(t.size),
            min_version=int(gen.min()) if gen.size else -1,
            max_version=int(gen.max()) if gen.size else -1,
            mask=m,
        )


def unstore(tokens: bytes, loss_mask: bytes, logprobs: bytes, versions: bytes):
    """Wire-format (packed little-endian) arrays from their stored form."""
    return tokens, zlib.decompress(loss_mask), logprobs, zlib.decompress(versions)


def _fail(where: str, message: str) -> DecodeError:
    return DecodeError(f"invalid TrajectoryPush: {where}: {message}", [where])


def check_packed(tr: dict, where: str) -> PackedArrays:
    """The packed arrays of one trajectory, checked, and kept as the bytes that arrived."""
    arrays = {}
    for name, dtype in ARRAY_FIELDS:
        buf = tr[name]
        if len(buf) % 4:
            raise _fail(
                f"{where}.{name}",
                f"packed array of {len(buf)} bytes is not a whole number of {dtype} items",
            )
        arrays[name] = np.frombuffer(buf, dtype=dtype)
    n = arrays["tokens"].size
    if n > MAX_ARRAY_ITEMS:
        raise _fail(f"{where}.tokens", f"array of {n} items exceeds the limit of {MAX_ARRAY_ITEMS}")
    problem = token_array_problem(
        arrays["tokens"], arrays["loss_mask"], arrays["logprobs"], arrays["versions"]
    )
    if problem is not None:
        raise _fail(f"{where}.{problem.field}", problem.message)
    mask = arrays["loss_mask"]
    return PackedArrays._build(
        arrays["tokens"],
        mask,
        arrays["logprobs"],
        arrays["versions"],
        received={name: tr[name] for name, _ in ARRAY_FIELDS},
    )


def decode_push(
    body: bytes, limit: int
) -> tuple[TrajectoryPush, dict[tuple[int, int], PackedArrays]]:
    """A validated push and the packed arrays of its trajectories, keyed (episode, trajectory).

    Trajectories whose arrays arrived as lists are validated by pydantic as usual and get no entry
    (ingestion packs them itself)."""
    if len(body) > limit:
        raise BodyTooLarge(f"body of {len(body)} bytes exceeds the limit of {limit} bytes")
    try:
        raw = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except (ValueError, TypeError, RecursionError, msgpack.UnpackException) as exc:
        raise DecodeError(f"body is not valid msgpack: {exc or type(exc).__name__}") from exc
    packed: dict[tuple[int, int], PackedArrays] = {}
    episodes = raw.get("episodes") if isinstance(raw, dict) else None
    if isinstance(episodes, list):
        for i, ep in enumerate(episodes):
            trajs = ep.get("trajectories") if isinstance(ep, dict) else None
            if not isinstance(trajs, list):
                continue
            for j, tr in enumerate(trajs):
                if isinstance(tr, dict) and all(
                    isinstance(tr.get(name), bytes) for name, _ in ARRAY_FIELDS
                ):
                    packed[(i, j)] = check_packed(tr, f"episodes.{i}.trajectories.{j}")
                    for name, _ in ARRAY_FIELDS:
                        tr[name] = []
    push = validate(TrajectoryPush, raw, {CHECKED: True} if packed else None)
    for i, ep in enumerate(push.episodes):  # CHECKED lets empty arrays through: only packed ones
        for j, tr in enumerate(ep.trajectories):
            if not tr.tokens and (i, j) not in packed:
                raise _fail(
                    f"episodes.{i}.trajectories.{j}.tokens",
                    "tokens is empty; a trajectory needs at least one prompt token",
                )
            if (i, j) in packed:
                problem = turn_rewards_problem(tr.turn_rewards, packed[(i, j)].mask)
                if problem is not None:
                    raise _fail(f"episodes.{i}.trajectories.{j}.{problem.field}", problem.message)
    return push, packed
