"""The inference engine kinds: the one list the recipe schema, the engine factory and the CLI read.

Why a module of its own: the list was written out in three places (the recipe's ``Literal``, the
factory's ``ENGINE_KINDS``, the CLI's checks and help texts) and a new engine had to be added to
each. It imports only the standard library, so the CLI can build its help texts from it at start-up
without importing pydantic (the recipe schema) or the weights code (the engines package).

The arguments each kind accepts (``policies.NAME.engine_args``) are declared beside the engines,
one typed model per kind, in :data:`astraflow.rollout.engines.args.ENGINE_ARGS` (a test holds its
keys to this list): they need pydantic, which this module does not import.
"""

from __future__ import annotations

from typing import Literal, get_args

EngineKind = Literal["transformers", "vllm", "openai"]

#: Every kind :func:`astraflow.rollout.engines.make_engine` builds, in the order help texts show.
ENGINE_KINDS: tuple[str, ...] = get_args(EngineKind)

#: The kinds that load a checkpoint into their own process (``openai`` calls a model served
#: elsewhere, so ``astraflow serve policy`` has nothing to load for it).
CHECKPOINT_ENGINE_KINDS: tuple[str, ...] = tuple(k for k in ENGINE_KINDS if k != "openai")

#: The kinds that serve LoRA adapter policies of a base (``policies.NAME.base``): the base is a
#: checkpoint they load, the adapters ride on it.
ADAPTER_ENGINE_KINDS: tuple[str, ...] = CHECKPOINT_ENGINE_KINDS
