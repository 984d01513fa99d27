"""The env registry: built-in envs and third-party plugins, registered with Gymnasium too.

Third-party packages expose a callable through the entry-point group ``astraflow.envs``; it receives
nothing and returns (or yields) :class:`EnvSpec` objects. Each spec is registered with Gymnasium under
its id, so ``gymnasium.make("acme/Maze-v0")`` works as soon as the plugin is installed.
"""

from __future__ import annotations

import inspect
from typing import Any

import gymnasium as gym
from astraflow.envs.ecosystems import family_spec
from astraflow.envs.spec import EnvSpec

from astraflow.plugins import LoadedEntryPoint
from astraflow.registry import Registry, UnknownNameError, call_or_take, expect_type

ENV_GROUP = "astraflow.envs"

__all__ = ["ENV_GROUP", "EnvRegistry", "EnvSpec", "UnknownEnvError", "default_registry", "make_env"]


def _accept_spec(obj: Any, ep: LoadedEntryPoint) -> EnvSpec:
    """A plugin's spec, credited to the plugin's distribution unless it names its own source."""
    expect_type(obj, EnvSpec)
    if obj.source == "astraflow" and ep.dist != "astraflow":
        obj = EnvSpec(**{**obj.__dict__, "source": ep.dist})
    return obj


class UnknownEnvError(UnknownNameError):
    """An env id no spec is registered under (what ``astraflow envs show`` catches)."""


class EnvRegistry(Registry[EnvSpec]):
    """Specs by id, discovered from entry points on first use, each registered with Gymnasium.

    An id ``PREFIX:NAME`` whose prefix is an :data:`astraflow.envs.ecosystems.FAMILIES` family
    (``skyrl:gsm8k``, ``textarena:GuessTheNumber-v0``, ``gym:ID``) resolves to that
    family's adapter spec on first lookup: the outside package's env is loaded by its own name,
    and the package itself is imported only when the env is built.
    """

    def __init__(self, group: str = ENV_GROUP):
        super().__init__(
            "env id",
            lambda spec: spec.id,
            group=group,
            unpack=lambda ep: call_or_take(ep, EnvSpec),
            accept=_accept_spec,
            origin=lambda spec: f"{spec.source} ({spec.entry_point})",
            unknown_error=UnknownEnvError,
        )

    def register(self, spec: EnvSpec) -> EnvSpec:
        """Register ``spec`` here and with Gymnasium; an id taken by another spec is an error."""
        super().register(spec)
        if spec.id not in gym.registry:
            gym.register(
                id=spec.id,
                entry_point=spec.entry_point,
                kwargs=dict(spec.kwargs),
                disable_env_checker=True,
            )
        return spec

    add = register

    def get(self, name: str) -> EnvSpec:
        """The spec of ``name``; a family id (``skyrl:gsm8k``) is resolved by its family."""
        self.discover()
        if name not in self._items:
            spec = family_spec(name)
            if spec is not None:
                # Not registered with Gymnasium: its make() reads "module:id" from such an id.
                Registry.register(self, spec)
        return super().get(name)

    def specs(self) -> list[EnvSpec]:
        return self.items()

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
