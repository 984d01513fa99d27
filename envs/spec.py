"""What an environment is registered as: its id, where its class lives, and its default kwargs.

Its own module so that the registry and the ecosystem families (which build specs for
``PREFIX:NAME`` ids) both depend on it, and not on each other.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class EnvSpec:
    id: str
    entry_point: str  # "module:Class"
    family: str = "misc"
    description: str = ""
    source: str = "astraflow"
    kwargs: dict[str, Any] = field(default_factory=dict)

    def load_class(self) -> type:
        module, _, name = self.entry_point.partition(":")
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            raise ImportError(
                f"env {self.id!r}: cannot load entry point {self.entry_point!r} "
                f"(from {self.source}): {type(exc).__name__}: {exc}"
            ) from exc
