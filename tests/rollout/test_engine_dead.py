"""The node tells a dead engine from a failed request by exception class (not by class name)."""

from __future__ import annotations

from astraflow.rollout.engines.base import EngineDeadError
from astraflow.rollout.engines.transformers_engine import EngineClosedError
from astraflow.rollout.node import EngineFailure, _is_engine_dead


def _wrapped(cause: BaseException) -> RuntimeError:
    """``cause`` as a workflow sees it: raised from inside another exception."""
    try:
        try:
            raise cause
        except BaseException as exc:
            raise RuntimeError("the episode failed") from exc
    except RuntimeError as outer:
        return outer


def test_dead_engine_errors_are_matched_by_class_along_the_cause_chain():
    assert issubclass(EngineClosedError, EngineDeadError)
    assert _is_engine_dead(EngineClosedError("the engine is closed"))
    assert _is_engine_dead(_wrapped(EngineClosedError("the engine is closed")))
    assert _is_engine_dead(_wrapped(EngineFailure("failed to load version 3")))
    assert not _is_engine_dead(_wrapped(ValueError("prompt too long")))


def test_a_same_named_class_from_elsewhere_is_not_a_dead_engine():
    """Matching by name took any library's ``EngineClosedError`` (or ``EngineDeadError``) for a
    dead engine and stopped the node; only the engine interface's classes count now."""
    for name in ("EngineClosedError", "EngineDeadError"):
        lookalike = type(name, (RuntimeError,), {})
        assert not _is_engine_dead(lookalike("one request failed"))
        assert not _is_engine_dead(_wrapped(lookalike("one request failed")))
