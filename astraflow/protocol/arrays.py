"""Compact numeric arrays for the wire.

Token ids, log-probs and per-token versions dominate every body the services exchange. As msgpack
lists of Python ints they cost 1-5 bytes per element plus a Python object per element on both ends;
as little-endian binary they cost a fixed 4 bytes and decode with one ``numpy.frombuffer``. In JSON
(humans, tests) the same fields are plain lists, so both encodings validate into the same model.
"""

from __future__ import annotations

from typing import Annotated, Any, NamedTuple

import numpy as np
from pydantic import BeforeValidator, Field, PlainSerializer, SerializationInfo

#: Context key that asks the serializers for binary arrays (set by :mod:`astraflow.protocol.codec`).
PACKED = "packed"
#: Validation-context key: the per-token arrays were checked packed, before validation, and
#: arrive empty (the msgpack fast path, :mod:`astraflow.dataflow.storage.packed`).
CHECKED = "arrays_checked"
#: Longest array accepted anywhere on the wire. Checked before a packed buffer is expanded into
#: Python objects, so an oversized body is refused without allocating millions of ints.
MAX_ARRAY_ITEMS = 262_144
INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1


def _decoder(dtype: str, kind: type):
    def decode(value: Any) -> Any:
        if isinstance(value, (bytes, bytearray, memoryview)):
            buf = bytes(value)
            itemsize = np.dtype(dtype).itemsize
            if len(buf) % itemsize:
                raise ValueError(
                    f"packed array of {len(buf)} bytes is not a whole number of {dtype} items"
                )
            _check_length(len(buf) // itemsize)
            return np.frombuffer(buf, dtype=dtype).tolist()
        if isinstance(value, np.ndarray):
            _check_length(value.size)
            if value.ndim != 1:
                raise ValueError(f"expected a 1-D array, got shape {value.shape}")
            if np.dtype(dtype).kind == "i" and value.dtype.kind not in "iub":
                raise ValueError(f"expected an integer array, got dtype {value.dtype}")
            return value.tolist()
        if isinstance(value, (list, tuple)):
            _check_length(len(value))
            return list(value)
        raise ValueError(f"expected a list of {kind.__name__} or packed {dtype} bytes")

    return decode


def _check_length(n: int) -> None:
    if n > MAX_ARRAY_ITEMS:
        raise ValueError(f"array of {n} items exceeds the limit of {MAX_ARRAY_ITEMS} items")


def _encoder(dtype: str):
    def encode(value: list, info: SerializationInfo) -> Any:
        if info.context and info.context.get(PACKED):
            return np.asarray(value, dtype=dtype).tobytes()
        return list(value)

    return encode


#: One element of an int32 array; the bounds make an out-of-range id a validation error at
#: construction instead of an overflow when the body is encoded.
Int32 = Annotated[int, Field(ge=INT32_MIN, le=INT32_MAX)]

#: Token ids (int32 on the wire).
TokenArray = Annotated[
    list[Int32],
    BeforeValidator(_decoder("<i4", int)),
    PlainSerializer(_encoder("<i4"), when_used="always"),
]
#: Per-token float values such as log-probs (float32 on the wire: values are rounded to float32
#: precision by a msgpack round trip; -inf/inf/nan survive both encodings).
FloatArray = Annotated[
    list[float],
    BeforeValidator(_decoder("<f4", float)),
    PlainSerializer(_encoder("<f4"), when_used="always"),
]
#: Per-token small ints such as loss masks and versions (int32 on the wire).
IntArray = TokenArray


class Problem(NamedTuple):
    """What is wrong with a value at the door: the field (dotted path) and why."""

    field: str
    message: str


def token_array_problem(tokens, loss_mask, logprobs, versions) -> Problem | None:
    """(field, what is wrong) for per-token arrays that break the wire rules, else None.

    The rules (docs/architecture.md, "Validation at the door"): at least one token; the four
    arrays of equal length; token ids >= 0; a loss mask of 0/1 that is 0 on the first token (a
    prompt token: the first generated token needs one before it to be scored); finite log-probs;
    versions >= -1. One function for the pydantic types and for the packed msgpack fast path
    (which passes numpy arrays), so both refuse exactly the same pushes."""
    t = np.asarray(tokens)
    n = t.size
    if n == 0:
        return Problem("tokens", "tokens is empty; a trajectory needs at least one prompt token")
    for name, arr in (("loss_mask", loss_mask), ("logprobs", logprobs), ("versions", versions)):
        if len(arr) != n:
            return Problem(
                name,
                f"{name} has {len(arr)} entries but tokens has {n}; "
                "per-token arrays must align with tokens",
            )
    m = np.asarray(loss_mask)
    if bool(((m != 0) & (m != 1)).any()):
        return Problem("loss_mask", "loss_mask must contain only 0 and 1")
    if m[0] != 0:
        return Problem("loss_mask", "loss_mask[0] must be 0: the first token is a prompt token")
    if int(t.min()) < 0:
        return Problem("tokens", f"token ids must be >= 0, got {int(t.min())}")
    lp = np.asarray(logprobs, dtype=np.float64)
    if not bool(np.isfinite(lp).all()):
        bad = int(np.flatnonzero(~np.isfinite(lp))[0])
        return Problem("logprobs", f"logprobs must be finite, logprobs[{bad}] is {lp[bad]}")
    v = np.asarray(versions)
    if int(v.min()) < -1:
        return Problem("versions", f"versions must be >= -1, got {int(v.min())}")
    return None


def generated_runs(loss_mask) -> list[tuple[int, int]]:
    """``[start, end)`` of each run of generated tokens (loss mask 1): one per generated turn."""
    m = np.asarray(loss_mask, dtype=np.int8)
    edges = np.diff(np.concatenate(([0], m, [0])))
    return list(
        zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist(), strict=True)
    )


def turn_rewards_problem(turn_rewards, loss_mask) -> Problem | None:
    """``turn_rewards`` must hold one reward per generated turn (run of loss mask 1)."""
    if turn_rewards is None:
        return None
    runs = len(generated_runs(loss_mask))
    if len(turn_rewards) != runs:
        return Problem(
            "turn_rewards",
            f"turn_rewards has {len(turn_rewards)} entries but the loss mask has {runs} generated "
            "turn(s) (runs of 1); give one reward per generated turn, in order",
        )
    return None


def vocab_problem(tokens, vocab_size: int | None, context_length: int | None) -> str | None:
    """What is wrong with ``tokens`` for a model of ``vocab_size`` ids and ``context_length``
    positions (either None: not known, not checked), else None."""
    t = np.asarray(tokens)
    if vocab_size is not None and t.size and int(t.max()) >= vocab_size:
        return f"token id {int(t.max())} is outside the policy's vocabulary [0, {vocab_size})"
    if context_length is not None and t.size > context_length:
        return f"{t.size} tokens exceed the policy's context length of {context_length}"
    return None
