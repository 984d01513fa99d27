"""Compact numeric arrays for the wire.

Token ids, log-probs and per-token versions dominate every body the services exchange. As msgpack
lists of Python ints they cost 1-5 bytes per element plus a Python object per element on both ends;
as little-endian binary they cost a fixed 4 bytes and decode with one ``numpy.frombuffer``. In JSON
(humans, tests) the same fields are plain lists, so both encodings validate into the same model.
"""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from pydantic import BeforeValidator, Field, PlainSerializer, SerializationInfo

#: Context key that asks the serializers for binary arrays (set by :mod:`astraflow.protocol.codec`).
PACKED = "packed"
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
