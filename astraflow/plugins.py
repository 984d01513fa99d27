"""Entry-point discovery shared by every plugin group (``astraflow.envs``, ``astraflow.tasks``,
``astraflow.policies``, ``astraflow.workflows``), used by :class:`astraflow.registry.Registry`.

Why a module of its own: each registry needs the same three things from ``importlib.metadata``:
load every entry point of a group, say which distribution it came from, and keep a broken plugin
from breaking the command that lists the others (its error is kept, named, for the CLI to show).
It imports only the standard library, so a registry can use it at CLI start-up.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
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


#: Serialises loading ``.py`` files by path. The import system locks dotted imports per module,
#: but a file loaded through ``spec_from_file_location`` has no such lock: envs are made in several
#: threads of a node's env pool at once, and without this one thread found another's module in
#: ``sys.modules`` before its body had run (``has no function 'hint'``). Re-entrant, so a file that
#: loads another file through this function does not deadlock.
_FILE_IMPORT_LOCK = threading.RLock()


def import_location(where: str, prefix: str, *, fresh: bool = False) -> ModuleType:
    """The module a ``where:name`` reference names: a dotted module path, or a ``.py`` file
    (loaded as ``{prefix}_{stem}``; ``fresh`` re-runs a file loaded before). Raises what the import
    raises (``FileNotFoundError`` for a missing file), for the caller to name in its own terms.
    Thread-safe: a file is executed once, and no caller sees it before its body has run."""
    if not where.endswith(".py"):
        return importlib.import_module(where)
    path = Path(where).resolve()
    spec = importlib.util.spec_from_file_location(f"{prefix}_{path.stem}", path)
    if spec is None or spec.loader is None or not path.is_file():
        raise FileNotFoundError(f"no such file {path}")
    with _FILE_IMPORT_LOCK:
        module = None if fresh else sys.modules.get(spec.name)
        if module is None:
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(spec.name, None)  # a failed body is not a loaded module
                raise
    return module
