"""The task-set interface: named sets with splits, from a generator, a local file or a hub.

A task set yields *task payloads*: plain dicts that an env's ``reset(options={"task": payload})``
accepts, each with a stable ``id``. Loaders are registered by name so recipes can say
``sets = [{ name = "gsm8k", split = "train" }]``.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Payload = dict[str, Any]
Loader = Callable[..., list[Payload]]


@dataclass(frozen=True)
class TaskSetInfo:
    name: str
    loader: Loader
    splits: tuple[str, ...]
    description: str = ""
    #: Env id the payloads are made for (the recipe may still choose another compatible env);
    #: empty for generic sets (``jsonl``) whose rows suit whatever env the recipe names.
    default_env: str = "astraflow/Math-v0"
    #: Distribution that registered the set ("astraflow" for the built-ins).
    source: str = "astraflow"


class UnknownTaskSetError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


class TaskSetRegistry:
    def __init__(self) -> None:
        self._sets: dict[str, TaskSetInfo] = {}
        #: Plugins that failed to load or register, by entry-point name (shown by the CLI).
        self.errors: dict[str, str] = {}

    def add(self, info: TaskSetInfo) -> None:
        """Register ``info``; a name taken by another source is an error (a plugin cannot
        silently replace a built-in set or another plugin's)."""
        known = self._sets.get(info.name)
        if known is not None and known.source != info.source:
            raise ValueError(
                f"task set {info.name!r} is registered twice: by {known.source} and by {info.source}"
            )
        self._sets[info.name] = info

    def infos(self) -> list[TaskSetInfo]:
        return [self._sets[n] for n in self.names()]

    def names(self) -> list[str]:
        return sorted(self._sets)

    def info(self, name: str) -> TaskSetInfo:
        try:
            return self._sets[name]
        except KeyError:
            close = difflib.get_close_matches(name, list(self._sets), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise UnknownTaskSetError(
                f"unknown task set {name!r}{hint} (known: {', '.join(self.names())})"
            ) from None

    def load(
        self,
        name: str,
        split: str = "train",
        *,
        seed: int = 0,
        limit: int | None = None,
        **kwargs: Any,
    ) -> list[Payload]:
        info = self.info(name)
        if split not in info.splits:
            raise ValueError(
                f"task set {name!r} has no split {split!r}; splits: {', '.join(info.splits)}"
            )
        items = info.loader(split=split, seed=seed, **kwargs)
        return items[:limit] if limit is not None else items
