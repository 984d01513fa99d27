"""Inference engines behind one interface (see :mod:`astraflow.rollout.engines.base`).

Backends are imported lazily by :func:`make_engine`, so importing this package never pulls in torch,
transformers or an HTTP client.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from astraflow.engine_kinds import ENGINE_KINDS
from astraflow.rollout.engines.base import Engine, Generation, SamplingParams, WeightUpdate

if TYPE_CHECKING:
    from astraflow.models.lora import AdapterSpec


def make_engine(
    kind: str,
    model: str,
    *,
    adapters: Sequence[AdapterSpec] = (),
    version: int = 0,
    **engine_args: Any,
) -> Engine:
    """Build the engine ``kind`` for ``model``.

    ``model``: for ``openai`` the served model's name; for the others a checkpoint directory,
    ``builtin:NAME`` or a Hugging Face id, looked up in the local HF cache (never downloaded:
    :func:`.local_models.local_checkpoint`). ``engine_args`` are the user's settings (a recipe's
    ``policies.NAME.engine_args``, ``--engine-arg``), checked against the kind's declared
    arguments (:mod:`.args`): an unknown or ill-typed key raises :class:`.args.EngineArgsError`
    naming it, the engine and the accepted keys, instead of a TypeError deep in a constructor.
    ``adapters`` (LoRA adapter policies served beside the base) and ``version`` (of the weights
    loaded) are set by the caller, not the user.
    """
    from astraflow.rollout.engines.args import parse_engine_args

    args = parse_engine_args(kind, engine_args).model_dump()
    if kind == "openai":
        if adapters:
            raise ValueError("the openai engine serves no LoRA adapters")
        from astraflow.rollout.engines.openai_engine import OpenAIEngine

        return OpenAIEngine(model=model, version=version, **args)
    from astraflow.rollout.engines.local_models import local_checkpoint

    path = local_checkpoint(str(model))
    if kind == "transformers":
        from astraflow.rollout.engines.transformers_engine import TransformersEngine

        return TransformersEngine(path, version=version, adapters=adapters, **args)
    from astraflow.rollout.engines.vllm_engine import VllmEngine

    return VllmEngine(path, version=version, adapters=adapters, **args)


__all__ = ["ENGINE_KINDS", "Engine", "Generation", "SamplingParams", "WeightUpdate", "make_engine"]
