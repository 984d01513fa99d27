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

from astraflow.errors import AstraFlowError
from astraflow.protocol.arrays import PACKED

MSGPACK = "application/msgpack"
JSON = "application/json"
#: Default upper bound on one body (bytes); services may set their own.
MAX_BODY_BYTES = 64 * 1024 * 1024

M = TypeVar("M", bound=BaseModel)


class DecodeError(AstraFlowError, ValueError):
    """A body that is not valid msgpack/JSON or does not match the expected model.

    ``fields`` lists the dotted paths of offending fields, so a 422 reply can name them.
    """

    #: HTTP status a service should answer with.
    status = 422

    def __init__(self, message: str, fields: list[str] | None = None):
        super().__init__(message)
        self.fields = fields or []


class BodyTooLarge(DecodeError):
    """A body over the size limit; refused before any parsing (HTTP 413)."""

    status = 413


def encode(model: BaseModel, content_type: str = MSGPACK) -> bytes:
    """Serialize a protocol model: msgpack with packed token arrays, or plain JSON."""
    if content_type == JSON:
        return model.model_dump_json().encode()
    data = model.model_dump(mode="python", context={PACKED: True})
    return msgpack.packb(data, use_bin_type=True)


def decode(
    cls: type[M], body: bytes, content_type: str = MSGPACK, max_bytes: int = MAX_BODY_BYTES
) -> M:
    """Parse and validate one body; every failure is a :class:`DecodeError` (never another type)."""
    if len(body) > max_bytes:
        raise BodyTooLarge(f"body of {len(body)} bytes exceeds the limit of {max_bytes} bytes")
    is_json = content_type.startswith(JSON)
    try:
        if is_json:
            raw = json.loads(body)
        else:
            raw = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except (ValueError, TypeError, RecursionError, msgpack.UnpackException) as exc:
        kind = "JSON" if is_json else "msgpack"
        reason = str(exc) or type(exc).__name__
        if isinstance(exc, msgpack.OutOfData) or (not is_json and not str(exc)):
            reason = "truncated or malformed data"
        raise DecodeError(f"body is not valid {kind}: {reason}") from exc
    return validate(cls, raw)


def validate(cls: type[M], raw: object, context: dict | None = None) -> M:
    """Validate already-parsed data; ``DecodeError.fields`` holds the dotted path of each problem.
    ``context``: pydantic's validation context (see :data:`astraflow.protocol.arrays.CHECKED`)."""
    try:
        return cls.model_validate(raw, context=context)
    except ValidationError as exc:
        errors = exc.errors()
        fields = [_loc(err["loc"]) for err in errors]
        details = "; ".join(f"{_loc(err['loc'])}: {err['msg']}" for err in errors[:10])
        more = f" (and {len(errors) - 10} more)" if len(errors) > 10 else ""
        raise DecodeError(f"invalid {cls.__name__}: {details}{more}", fields) from exc


def _loc(loc: tuple) -> str:
    return ".".join(str(p) for p in loc) or "<body>"


def encode_obj(obj: object) -> bytes:
    """msgpack for plain data (dicts of numbers/strings), e.g. status documents."""
    return msgpack.packb(obj, use_bin_type=True)


def decode_obj(body: bytes) -> object:
    return msgpack.unpackb(body, raw=False)
