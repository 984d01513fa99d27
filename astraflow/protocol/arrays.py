"""Compact numeric arrays for the wire.

Token ids, log-probs and per-token versions dominate every body the services exchange. As msgpack
lists of Python ints they cost 1-5 bytes per element plus a Python object per element on both ends;
as little-endian binary they cost a fixed 4 bytes and decode with one ``numpy.frombuffer``. In JSON
(humans, tests) the same fields are plain lists, so both encodings validate into the same model.
"""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from pydantic import BeforeValidator, PlainSerializer, SerializationInfo

#: Context key that asks the serializers for binary arrays (set by :mod:`astraflow.protocol.codec`).
PACKED = "packed"


def _decoder(dtype: str, kind: type):
    def decode(value: Any) -> Any:
        if isinstance(value, (bytes, bytearray, memoryview)):
            buf = bytes(value)
            itemsize = np.dtype(dtype).itemsize
            if len(buf) % itemsize:
                raise ValueError(
                    f"packed array of {len(buf)} bytes is not a whole number of {dtype} items"
                )
            return np.frombuffer(buf, dtype=dtype).tolist()
        if isinstance(value, np.ndarray):
            return value.astype(dtype).tolist()
        if isinstance(value, (list, tuple)):
            return list(value)
        raise ValueError(f"expected a list of {kind.__name__} or packed {dtype} bytes")

    return decode


def _encoder(dtype: str):
    def encode(value: list, info: SerializationInfo) -> Any:
        if info.context and info.context.get(PACKED):
            return np.asarray(value, dtype=dtype).tobytes()
        return list(value)

    return encode


#: Token ids (int32 on the wire).
TokenArray = Annotated[
    list[int],
    BeforeValidator(_decoder("<i4", int)),
    PlainSerializer(_encoder("<i4"), when_used="always"),
]
#: Per-token float values such as log-probs (float32 on the wire).
FloatArray = Annotated[
    list[float],
    BeforeValidator(_decoder("<f4", float)),
    PlainSerializer(_encoder("<f4"), when_used="always"),
]
#: Per-token small ints such as loss masks and versions (int32 on the wire).
IntArray = TokenArray
