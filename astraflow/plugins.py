"""Entry-point discovery shared by every plugin group (``astraflow.envs``, ``astraflow.tasks``,
``astraflow.policies``, ``astraflow.workflows``), used by :class:`astraflow.registry.Registry`.

Why a module of its own: each registry needs the same three things from ``importlib.metadata``:
load every entry point of a group, say which distribution it came from, and keep a broken plugin
from breaking the command that lists the others (its error is kept, named, for the CLI to show).
It imports only the standard library, so a registry can use it at CLI start-up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any


@dataclass(frozen=True)
class LoadedEntryPoint:
    """One entry point that loaded: its name, the object it names and its distribution."""

    name: str
    value: str  # "module:attr", as declared
    obj: Any
    dist: str  # distribution name, e.g. "acme-tasks" ("unknown" when metadata has none)


@dataclass
class Discovery:
    """What :func:`discover` found: the entry points that loaded and, by name, those that did not."""

    group: str
    loaded: list[LoadedEntryPoint] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)


def plugin_error(group: str, name: str, value: str, exc: BaseException) -> str:
    """The message shown for a plugin that failed: the group, the entry point and why."""
    return f"{group} entry point {name!r} ({value}) failed: {type(exc).__name__}: {exc}"


def discover(group: str) -> Discovery:
    """Load every entry point of ``group``; a failing one is recorded in ``errors``, not raised."""
    found = Discovery(group)
    for ep in entry_points(group=group):
        try:
            obj = ep.load()
        except Exception as exc:  # a broken plugin must not hide the others
            found.errors[ep.name] = plugin_error(group, ep.name, ep.value, exc)
            continue
        dist = ep.dist.name if ep.dist is not None else "unknown"
        found.loaded.append(LoadedEntryPoint(ep.name, ep.value, obj, dist))
    return found
