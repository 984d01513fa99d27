"""The env registry: built-in envs and third-party plugins, registered with Gymnasium too.

Third-party packages expose a callable through the entry-point group ``astraflow.envs``; it receives
nothing and returns (or yields) :class:`EnvSpec` objects. Each spec is registered with Gymnasium under
its id, so ``gymnasium.make("acme/Maze-v0")`` works as soon as the plugin is installed.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

import gymnasium as gym

ENV_GROUP = "astraflow.envs"


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


def close_ids(env_id: str, known: list[str], n: int = 3) -> list[str]:
    """Known ids that look like ``env_id``: case-insensitive, with or without the namespace."""
    by_lower = {k.lower(): k for k in known}
    by_name = {k.lower().rpartition("/")[2]: k for k in known}
    wanted = env_id.lower()
    hits = difflib.get_close_matches(wanted, list(by_lower), n=n, cutoff=0.5)
    close = [by_lower[h] for h in hits]
    for h in difflib.get_close_matches(wanted.rpartition("/")[2], list(by_name), n=n, cutoff=0.6):
        if by_name[h] not in close:
            close.append(by_name[h])
    return close[:n]


class UnknownEnvError(KeyError):
    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0])


class EnvRegistry:
    """Specs by id, discovered from entry points on first use."""

    def __init__(self, group: str = ENV_GROUP):
        self.group = group
        self._specs: dict[str, EnvSpec] = {}
        self._loaded = False
        self.errors: dict[str, str] = {}

    def add(self, spec: EnvSpec) -> None:
        """Register ``spec`` here and with Gymnasium; an id taken by another spec is an error."""
        known = self._specs.get(spec.id)
        if known is not None and known != spec:
            raise ValueError(
                f"env id {spec.id!r} is registered twice: by {known.source} "
                f"({known.entry_point}) and by {spec.source} ({spec.entry_point})"
            )
        self._specs[spec.id] = spec
        if spec.id not in gym.registry:
            gym.register(
                id=spec.id,
                entry_point=spec.entry_point,
                kwargs=dict(spec.kwargs),
                disable_env_checker=True,
            )

    def discover(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        for ep in entry_points(group=self.group):
            try:
                specs: Iterable[EnvSpec] = list(ep.load()() or [])
            except Exception as exc:  # a broken plugin must not break the CLI
                self.errors[ep.name] = f"{type(exc).__name__}: {exc}"
                continue
            for spec in specs:
                try:
                    if not isinstance(spec, EnvSpec):
                        raise TypeError(f"expected EnvSpec objects, got {type(spec).__name__}")
                    if (
                        spec.source == "astraflow"
                        and ep.dist is not None
                        and ep.dist.name != "astraflow"
                    ):
                        spec = EnvSpec(**{**spec.__dict__, "source": ep.dist.name})
                    self.add(spec)
                except Exception as exc:  # one bad spec does not hide the plugin's others
                    self.errors[f"{ep.name}:{getattr(spec, 'id', spec)}"] = (
                        f"{type(exc).__name__}: {exc}"
                    )

    def specs(self) -> list[EnvSpec]:
        self.discover()
        return sorted(self._specs.values(), key=lambda s: s.id)

    def get(self, env_id: str) -> EnvSpec:
        self.discover()
        try:
            return self._specs[env_id]
        except KeyError:
            close = close_ids(env_id, list(self._specs))
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise UnknownEnvError(
                f"unknown env id {env_id!r}{hint} (`astraflow envs list` shows all {len(self._specs)})"
            ) from None

    def make(self, env_id: str, **kwargs: Any):
        """An instance of ``env_id``; unknown kwargs are named along with the accepted ones."""
        spec = self.get(env_id)
        cls = spec.load_class()
        merged = {**spec.kwargs, **kwargs}
        try:
            inspect.signature(cls).bind(**merged)
        except TypeError as exc:
            accepted = [
                name
                for name, p in inspect.signature(cls).parameters.items()
                if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            ]
            raise TypeError(
                f"env {env_id!r} ({spec.entry_point}) does not accept kwargs {sorted(merged)}: "
                f"{exc}; accepted: {', '.join(accepted)}"
            ) from None
        return cls(**merged)


def default_registry() -> EnvRegistry:
    """A fresh registry with every installed env discovered (no module-level mutable state)."""
    reg = EnvRegistry()
    reg.discover()
    return reg


def make_env(env_id: str, **kwargs: Any):
    return default_registry().make(env_id, **kwargs)
