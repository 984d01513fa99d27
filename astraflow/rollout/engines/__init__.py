"""Inference engines behind one interface (see :mod:`astraflow.rollout.engines.base`).

Backends are imported lazily by :func:`make_engine`, so importing this package never pulls in torch,
transformers or an HTTP client.
"""

from __future__ import annotations

from typing import Any

from astraflow.engine_kinds import ENGINE_KINDS
from astraflow.rollout.engines.base import Engine, Generation, SamplingParams, WeightUpdate


def make_engine(kind: str, model: str, **engine_args: Any) -> Engine:
    """Build the engine ``kind`` for ``model`` (a checkpoint path, or the served model's name).

    ``engine_args`` go to the backend's constructor: see :class:`.transformers_engine.
    TransformersEngine`, :class:`.vllm_engine.VllmEngine` and :class:`.openai_engine.OpenAIEngine`.
    """
    if kind == "transformers":
        from astraflow.rollout.engines.transformers_engine import TransformersEngine

        return TransformersEngine(model, **engine_args)
    if kind == "vllm":
        from astraflow.rollout.engines.vllm_engine import VllmEngine

        return VllmEngine(model, **engine_args)
    if kind == "openai":
        from astraflow.rollout.engines.openai_engine import OpenAIEngine

        return OpenAIEngine(model=model, **engine_args)
    raise ValueError(f"unknown engine kind {kind!r}; expected one of {', '.join(ENGINE_KINDS)}")


__all__ = ["ENGINE_KINDS", "Engine", "Generation", "SamplingParams", "WeightUpdate", "make_engine"]
