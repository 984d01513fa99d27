"""The task-set interface: named sets with splits, from a generator, a local file or a hub.

A task set yields *task payloads*: plain dicts that an env's ``reset(options={"task": payload})``
accepts, each with a stable ``id``. Loaders are registered by name so recipes can say
``sets = [{ name = "gsm8k", split = "train" }]``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from astraflow.plugins import LoadedEntryPoint
from astraflow.registry import Registry, UnknownNameError, call_or_take, expect_type

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


def _accept_info(obj: Any, ep: LoadedEntryPoint) -> TaskSetInfo:
    """A plugin's set, credited to the plugin's distribution unless it names its own source."""
    expect_type(obj, TaskSetInfo)
    if obj.source == "astraflow":
        obj = TaskSetInfo(**{**obj.__dict__, "source": ep.dist})
    return obj


class UnknownTaskSetError(UnknownNameError):
    """A task-set name nothing is registered under (what ``astraflow tasks show`` catches)."""


class TaskSetRegistry(Registry[TaskSetInfo]):
    """Task sets by name. Holds only what is added: :func:`astraflow.tasks.catalog.default_task_sets` adds
    the built-ins and the ``astraflow.tasks`` plugins (:func:`astraflow.tasks.catalog.add_plugins`)."""

    def __init__(self) -> None:
        super().__init__(
            "task set",
            lambda info: info.name,
            unpack=lambda ep: call_or_take(ep, TaskSetInfo),
            accept=_accept_info,
            origin=lambda info: info.source,
            unknown_error=UnknownTaskSetError,
        )

    def add(self, info: TaskSetInfo) -> None:
        """Register ``info``; a name taken by another set is an error (a plugin cannot silently
        replace a built-in set or another plugin's)."""
        self.register(info)

    def infos(self) -> list[TaskSetInfo]:
        return self.items()

    def info(self, name: str) -> TaskSetInfo:
        return self.get(name)

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
