"""The env registry: built-in envs and third-party plugins, registered with Gymnasium too.

Third-party packages expose a callable through the entry-point group ``astraflow.envs``; it receives
nothing and returns (or yields) :class:`EnvSpec` objects. Each spec is registered with Gymnasium under
its id, so ``gymnasium.make("acme/Maze-v0")`` works as soon as the plugin is installed.
"""

from __future__ import annotations

import difflib
import importlib
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
        return getattr(importlib.import_module(module), name)


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
        self._specs[spec.id] = spec
        if spec.id not in gym.registry:
            gym.register(id=spec.id, entry_point=spec.entry_point, kwargs=dict(spec.kwargs),
                         disable_env_checker=True)

    def discover(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        for ep in entry_points(group=self.group):
            try:
                result = ep.load()()
                specs: Iterable[EnvSpec] = result or []
                for spec in specs:
                    if spec.source == "astraflow" and ep.dist is not None and ep.dist.name != "astraflow":
                        spec = EnvSpec(**{**spec.__dict__, "source": ep.dist.name})
                    self.add(spec)
            except Exception as exc:  # a broken plugin must not break the CLI
                self.errors[ep.name] = f"{type(exc).__name__}: {exc}"

    def specs(self) -> list[EnvSpec]:
        self.discover()
        return sorted(self._specs.values(), key=lambda s: s.id)

    def get(self, env_id: str) -> EnvSpec:
        self.discover()
        try:
            return self._specs[env_id]
        except KeyError:
            close = difflib.get_close_matches(env_id, list(self._specs), n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise UnknownEnvError(
                f"unknown env id {env_id!r}{hint} (`astraflow envs list` shows all {len(self._specs)})"
            ) from None

    def make(self, env_id: str, **kwargs: Any):
        spec = self.get(env_id)
        return spec.load_class()(**{**spec.kwargs, **kwargs})


def default_registry() -> EnvRegistry:
    """A fresh registry with every installed env discovered (no module-level mutable state)."""
    reg = EnvRegistry()
    reg.discover()
    return reg


def make_env(env_id: str, **kwargs: Any):
    return default_registry().make(env_id, **kwargs)
