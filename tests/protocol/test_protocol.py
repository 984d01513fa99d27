"""Wire protocol: every model survives msgpack and JSON, bad bodies fail with the field named.

Strategies are derived from each model's own field annotations and constraints, so a model added
to ``astraflow.protocol`` is covered without touching this file (the cross-field rules of
Trajectory, Sample and Episode get hand-written strategies).
"""

from __future__ import annotations

import json
import math
import types
import typing
from typing import Any, Literal, Union

import annotated_types as at
import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from pydantic.fields import FieldInfo

import astraflow.protocol as protocol
from astraflow.protocol import (
    JSON,
    MSGPACK,
    BodyTooLarge,
    DecodeError,
    Episode,
    PartialEpisode,
    Sample,
    Task,
    Trajectory,
    TrajectoryPush,
    decode,
    encode,
)
from astraflow.protocol.arrays import INT32_MAX, MAX_ARRAY_ITEMS, TokenArray

PUBLIC_MODELS = sorted(
    (
        obj
        for obj in (getattr(protocol, name) for name in protocol.__all__)
        if isinstance(obj, type) and issubclass(obj, BaseModel)
    ),
    key=lambda m: m.__name__,
)

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Text that both msgpack (UTF-8) and JSON can carry: no lone surrogates.
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
INT64 = st.integers(-(2**63), 2**63 - 1)
FLOAT = st.floats(allow_nan=False, allow_infinity=False)
FLOAT32 = st.floats(width=32, allow_nan=False)  # survives the packed float32 encoding exactly
FINITE32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
JSON_SCALAR = st.none() | st.booleans() | INT64 | FLOAT | TEXT
JSON_VALUE = st.recursive(
    JSON_SCALAR,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)


def _bounds(metadata: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in metadata:
        for attr in ("ge", "gt", "le", "lt", "min_length", "max_length"):
            if getattr(m, attr, None) is not None:
                out[attr] = getattr(m, attr)
    return out


def strategy_for(annotation: Any, metadata: list[Any] | None = None) -> st.SearchStrategy:
    """A strategy of valid values for one annotated field, honouring ge/le/length constraints."""
    metadata = list(metadata or [])
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        base, *extra = typing.get_args(annotation)
        for m in extra:
            if isinstance(m, FieldInfo):
                metadata.extend(m.metadata)
            elif isinstance(m, at.BaseMetadata):
                metadata.append(m)
        return strategy_for(base, metadata)
    if annotation is type(None):
        return st.none()
    b = _bounds(metadata)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return model_strategy(annotation)
    if annotation is Any:
        return JSON_VALUE
    if annotation is bool:
        return st.booleans()
    if annotation is int:
        lo = b.get("ge", b["gt"] + 1 if "gt" in b else -(2**40))
        hi = b.get("le", b["lt"] - 1 if "lt" in b else 2**40)
        return st.integers(max(lo, -(2**62)), min(hi, 2**62))
    if annotation is float:
        return st.floats(
            min_value=b.get("ge", b.get("gt")),
            max_value=b.get("le", b.get("lt")),
            exclude_min="gt" in b,
            exclude_max="lt" in b,
            allow_nan=False,
            allow_infinity=False,
        )
    if annotation is str:
        lo, hi = b.get("min_length", 0), min(b.get("max_length", 12), 12)
        return st.text(st.characters(blacklist_categories=("Cs",)), min_size=lo, max_size=hi)
    if origin is Literal:
        return st.sampled_from(typing.get_args(annotation))
    if origin in (Union, types.UnionType):
        return st.one_of(*(strategy_for(a, metadata) for a in typing.get_args(annotation)))

    if origin is dict:
        _, value = typing.get_args(annotation)
        return st.dictionaries(TEXT, strategy_for(value), max_size=3)
    if origin is list:
        (item,) = typing.get_args(annotation)
        return st.lists(
            strategy_for(item),
            min_size=b.get("min_length", 0),
            max_size=min(b.get("max_length", 3), 3),
        )
    raise NotImplementedError(
        f"no strategy for {annotation!r}; extend tests/protocol/test_protocol.py"
    )


@st.composite
def token_arrays(draw, n: int | None = None) -> dict[str, list]:
    n = draw(st.integers(1, 40)) if n is None else n
    mask = draw(st.lists(st.sampled_from([0, 1]), min_size=n, max_size=n))
    return {
        "tokens": draw(st.lists(st.integers(0, INT32_MAX), min_size=n, max_size=n)),
        "loss_mask": [0, *mask[1:]],  # the first token is a prompt token
        "logprobs": draw(st.lists(FINITE32, min_size=n, max_size=n)),
        "versions": draw(st.lists(st.integers(-1, 10_000), min_size=n, max_size=n)),
    }


@st.composite
def trajectories(draw) -> Trajectory:
    return Trajectory(
        role=draw(st.text("abcxyz_", min_size=1, max_size=8)),
        num_turns=draw(st.integers(0, 50)),
        **draw(token_arrays()),
    )


@st.composite
def samples(draw) -> Sample:
    fields = {name: draw(TEXT) for name in ("policy", "role", "task_id", "episode_id", "group_id")}
    return Sample(
        **fields,
        **draw(token_arrays()),
        reward=draw(FLOAT),
        advantage=draw(FLOAT),
        weight=draw(st.floats(0, 1e6)),
    )


@st.composite
def episodes(draw) -> Episode:
    trajs = draw(st.lists(trajectories(), max_size=3))
    rewards = {t.role: draw(FLOAT) for t in trajs}
    return Episode(
        task_id=draw(TEXT),
        trajectories=trajs,
        rewards=rewards,
        finish_reason=draw(st.sampled_from(["terminated", "truncated", "turn_limit", "length"])),
        info=draw(st.dictionaries(TEXT, JSON_VALUE, max_size=3)),
        metrics=draw(st.dictionaries(TEXT, FLOAT, max_size=3)),
    )


@st.composite
def partial_episodes(draw) -> PartialEpisode:
    """A saved episode: its trajectories so far, or the finished episode (one of them)."""
    finished = draw(st.one_of(st.none(), episodes()))
    trajs = draw(st.lists(trajectories(), min_size=0 if finished else 1, max_size=3))
    return PartialEpisode(
        index=draw(st.integers(0, 1023)),
        turns=draw(st.integers(0, 1000)),
        trajectories=trajs,
        env_state=draw(st.one_of(st.none(), st.dictionaries(TEXT, JSON_VALUE, max_size=3))),
        workflow_state=draw(st.dictionaries(TEXT, JSON_VALUE, max_size=3)),
        finished=finished,
        elapsed_s=draw(st.floats(0, 1e6)),
    )


CUSTOM: dict[type[BaseModel], st.SearchStrategy] = {
    Trajectory: trajectories(),
    Sample: samples(),
    Episode: episodes(),
    PartialEpisode: partial_episodes(),
}


def model_strategy(model: type[BaseModel]) -> st.SearchStrategy:
    if model in CUSTOM:
        return CUSTOM[model]
    fields = {}
    for name, info in model.model_fields.items():
        strat = strategy_for(info.annotation, info.metadata)
        if not info.is_required():
            strat = st.one_of(st.just(_MISSING), strat)
        fields[name] = strat

    def build(values: dict[str, Any]) -> BaseModel:
        return model(**{k: v for k, v in values.items() if v is not _MISSING})

    return st.fixed_dictionaries(fields).map(build)


_MISSING = object()


def test_every_public_model_is_covered():
    """A new protocol model must be generatable here (else extend ``strategy_for``)."""
    assert len(PUBLIC_MODELS) >= 8
    for model in PUBLIC_MODELS:
        model_strategy(model)  # raises NotImplementedError for an unknown field type


@pytest.mark.parametrize("model", PUBLIC_MODELS, ids=lambda m: m.__name__)
@pytest.mark.parametrize("content_type", [MSGPACK, JSON])
def test_round_trip(model: type[BaseModel], content_type: str):
    @SETTINGS
    @given(model_strategy(model))
    def check(instance: BaseModel) -> None:
        body = encode(instance, content_type)
        assert isinstance(body, bytes)
        back = decode(model, body, content_type)
        assert back == instance
        if content_type == MSGPACK:
            raw = msgpack.unpackb(body, raw=False)
            assert "pickle" not in repr(type(raw))
        else:
            json.loads(body)  # a JSON body is plain JSON

    check()


@pytest.mark.parametrize("bad", [-math.inf, math.inf, math.nan])
def test_nonfinite_logprobs_are_refused_in_both_encodings(bad):
    """A log-prob the trainer would turn into a NaN loss is refused at the door, naming it."""
    raw = {
        "role": "agent",
        "tokens": [5, 6, 7],
        "loss_mask": [0, 1, 1],
        "logprobs": [0.0, bad, -0.5],
        "versions": [-1, 3, 3],
    }
    for content_type in (MSGPACK, JSON):
        body = msgpack.packb(raw) if content_type == MSGPACK else json.dumps(raw).encode()
        with pytest.raises(DecodeError, match=r"logprobs must be finite, logprobs\[1\]"):
            decode(Trajectory, body, content_type)


def test_token_arrays_are_packed_compactly():
    rng = np.random.default_rng(0)
    ids = rng.integers(100_000, 151_000, size=10_000).tolist()  # a modern vocabulary's range

    class Tokens(BaseModel):
        tokens: TokenArray

    packed = encode(Tokens(tokens=ids))
    as_json = encode(Tokens(tokens=ids), JSON)
    assert len(packed) < 45_000, len(packed)  # 4 bytes per token plus a few bytes of framing
    assert len(as_json) > 1.5 * len(packed), (len(as_json), len(packed))
    assert msgpack.unpackb(packed)["tokens"][:4] == np.asarray(ids[:1], "<i4").tobytes()
    assert decode(Tokens, packed).tokens == ids

    traj = Trajectory(
        role="agent",
        tokens=ids,
        loss_mask=[0] + [1] * 9_999,
        logprobs=[-0.25] * 10_000,
        versions=[7] * 10_000,
    )
    body = encode(traj)
    assert len(body) < 4 * 45_000
    assert len(encode(traj, JSON)) > len(body)


def test_numpy_arrays_are_accepted_and_float_arrays_refused_for_ids():
    traj = Trajectory(
        role="a",
        tokens=np.arange(4, dtype=np.int64),
        loss_mask=np.array([False, True, True, True]),
        logprobs=np.zeros(4, dtype=np.float32),
        versions=np.zeros(4, dtype=np.int32),
    )
    assert traj.tokens == [0, 1, 2, 3] and traj.loss_mask == [0, 1, 1, 1]
    with pytest.raises(ValueError, match="integer array"):
        Trajectory(role="a", tokens=np.ones(1), loss_mask=[1], logprobs=[0.0], versions=[0])


def _traj_dict(n: int = 3) -> dict[str, Any]:
    return {
        "role": "agent",
        "tokens": list(range(n)),
        "loss_mask": [1] * n,
        "logprobs": [0.0] * n,
        "versions": [0] * n,
    }


def test_oversized_arrays_are_rejected_in_both_encodings():
    n = MAX_ARRAY_ITEMS + 1
    packed = msgpack.packb({**_traj_dict(1), "tokens": np.zeros(n, "<i4").tobytes()})
    with pytest.raises(DecodeError) as exc:
        decode(Trajectory, packed)
    assert "tokens" in exc.value.fields
    assert "exceeds the limit" in str(exc.value)
    body = json.dumps({**_traj_dict(1), "tokens": [0] * n}).encode()
    with pytest.raises(DecodeError) as exc:
        decode(Trajectory, body, JSON)
    assert "tokens" in exc.value.fields


def test_oversized_body_is_refused_before_parsing():
    with pytest.raises(BodyTooLarge) as exc:
        decode(Task, b"\x00" * 2048, max_bytes=1024)
    assert exc.value.status == 413
    assert "2048 bytes exceeds the limit of 1024" in str(exc.value)


def test_token_ids_outside_int32_fail_at_construction_not_at_encoding():
    with pytest.raises(ValueError, match="tokens.0"):
        Trajectory(**{**_traj_dict(1), "tokens": [2**31]})


@pytest.mark.parametrize(
    ("body", "field", "needle"),
    [
        ({**_traj_dict(), "tokens": "abc"}, "tokens", "expected a list of int"),
        ({**_traj_dict(), "tokens": b"\x01\x02\x03"}, "tokens", "not a whole number"),
        ({**_traj_dict(), "loss_mask": [1, 2, 1]}, "<body>", "loss_mask must contain only 0 and 1"),
        ({**_traj_dict(), "logprobs": [0.0]}, "<body>", "logprobs has 1 entries"),
        ({**_traj_dict(), "role": ""}, "role", "at least 1 character"),
        ({**_traj_dict(), "colour": "red"}, "colour", "Extra inputs are not permitted"),
        ({k: v for k, v in _traj_dict().items() if k != "versions"}, "versions", "Field required"),
    ],
)
def test_validation_errors_name_the_field(body: dict, field: str, needle: str):
    for content_type in (MSGPACK, JSON):
        if content_type == JSON and isinstance(body.get("tokens"), bytes):
            continue
        raw = msgpack.packb(body) if content_type == MSGPACK else json.dumps(body).encode()
        with pytest.raises(DecodeError) as exc:
            decode(Trajectory, raw, content_type)
        assert field in exc.value.fields
        assert needle in str(exc.value)
        assert exc.value.status == 422


def test_nested_field_paths_are_dotted():
    push = {
        "node_id": "n1",
        "lease_id": "l1",
        "episodes": [{"task_id": "t", "trajectories": [{**_traj_dict(), "tokens": "x"}]}],
    }
    with pytest.raises(DecodeError) as exc:
        decode(TrajectoryPush, msgpack.packb(push))
    assert "episodes.0.trajectories.0.tokens" in exc.value.fields


@SETTINGS
@given(st.binary(max_size=64))
def test_garbage_bodies_only_raise_decode_error(body: bytes):
    for content_type in (MSGPACK, JSON):
        try:
            decode(Task, body, content_type)
        except DecodeError as exc:
            assert str(exc)
        else:  # pragma: no cover - a random body is a valid Task only by extreme luck
            pass


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"[" * 50_000 + b"]" * 50_000, JSON),
        (b"\x91" * 50_000, MSGPACK),
        (b"\x92", MSGPACK),
        (b"", MSGPACK),
        (b"\xff\xfe", JSON),
    ],
    ids=["deep-json", "deep-msgpack", "truncated", "empty", "not-utf8"],
)
def test_malformed_bodies_give_a_reason(body: bytes, content_type: str):
    with pytest.raises(DecodeError) as exc:
        decode(Task, body, content_type)
    message = str(exc.value)
    assert message.startswith("body is not valid")
    assert message.split(":", 1)[1].strip()  # a reason, not an empty string
