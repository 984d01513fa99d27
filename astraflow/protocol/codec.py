"""msgpack (and JSON) encoding of protocol models.

msgpack is the default body format: binary-safe, compact and fast. Token arrays are packed as raw
little-endian bytes (see :mod:`astraflow.protocol.arrays`). Nothing is ever pickled: a body decodes
into plain dicts, lists, numbers, strings and bytes, then through pydantic validation.
"""

from __future__ import annotations

import json
from typing import TypeVar

import msgpack
from pydantic import BaseModel, ValidationError

from astraflow.protocol.arrays import PACKED

MSGPACK = "application/msgpack"
JSON = "application/json"
#: Default upper bound on one body (bytes); services may set their own.
MAX_BODY_BYTES = 64 * 1024 * 1024

M = TypeVar("M", bound=BaseModel)


class DecodeError(ValueError):
    """A body that is not valid msgpack/JSON or does not match the expected model.

    ``fields`` lists the dotted paths of offending fields, so a 422 reply can name them.
    """

    def __init__(self, message: str, fields: list[str] | None = None):
        super().__init__(message)
        self.fields = fields or []


def encode(model: BaseModel, content_type: str = MSGPACK) -> bytes:
    if content_type == JSON:
        return model.model_dump_json().encode()
    data = model.model_dump(mode="python", context={PACKED: True})
    return msgpack.packb(data, use_bin_type=True)


def decode(cls: type[M], body: bytes, content_type: str = MSGPACK, max_bytes: int = MAX_BODY_BYTES) -> M:
    if len(body) > max_bytes:
        raise DecodeError(f"body of {len(body)} bytes exceeds the limit of {max_bytes} bytes")
    try:
        if content_type.startswith(JSON):
            raw = json.loads(body)
        else:
            raw = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        kind = "JSON" if content_type.startswith(JSON) else "msgpack"
        raise DecodeError(f"body is not valid {kind}: {exc}") from exc
    return validate(cls, raw)


def validate(cls: type[M], raw: object) -> M:
    try:
        return cls.model_validate(raw)
    except ValidationError as exc:
        fields = [".".join(str(p) for p in err["loc"]) or "<body>" for err in exc.errors()]
        details = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<body>'}: {err['msg']}" for err in exc.errors()[:10]
        )
        raise DecodeError(f"invalid {cls.__name__}: {details}", fields) from exc


def encode_obj(obj: object) -> bytes:
    """msgpack for plain data (dicts of numbers/strings), e.g. status documents."""
    return msgpack.packb(obj, use_bin_type=True)


def decode_obj(body: bytes) -> object:
    return msgpack.unpackb(body, raw=False)
