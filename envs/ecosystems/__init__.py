"""Env families from other ecosystems, addressed as ``PREFIX:NAME`` env ids.

``skyrl:gsm8k`` is SkyRL-gym's env registered as ``gsm8k``, ``verifiers:NAME`` an installed
verifiers environment, ``textarena:Wordle-v0`` a TextArena game, ``gym:ID`` any Gymnasium env
with text observations and actions. Why one table: each family is the same three facts (the
adapter class, the constructor kwarg the outside name goes to, the package and extra it needs),
and :meth:`astraflow.envs.registry.EnvRegistry.get` resolves every prefix the same way. The outside package
is imported only when an env is built (:func:`require`), with an error naming the extra.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from astraflow.envs.spec import EnvSpec

#: the pyproject extra that installs every ecosystem package
EXTRA = "ecosystems"


@dataclass(frozen=True)
class EnvFamily:
    prefix: str
    #: adapter class, "module:Class"; its constructor takes the outside name as ``name_kwarg``
    entry_point: str
    name_kwarg: str
    #: the importable module and the PyPI distribution that provides it
    module: str
    distribution: str
    description: str


FAMILIES: dict[str, EnvFamily] = {
    f.prefix: f
    for f in (
        EnvFamily("skyrl", "astraflow.envs.ecosystems.skyrl:SkyRLEnv", "env_name", "skyrl_gym",
                  "skyrl-gym", "A SkyRL-gym env by its registered id (BaseTextEnv init/step)"),
        EnvFamily("textarena", "astraflow.envs.ecosystems.textarena_env:TextArenaEnv", "env_name",
                  "textarena", "textarena", "A TextArena game by its id (single-player)"),
        EnvFamily("verifiers", "astraflow.envs.ecosystems.verifiers_env:VerifiersEnv", "env_name",
                  "verifiers", "verifiers",
                  "An installed verifiers environment by its name (load_environment())"),
        EnvFamily("gym", "astraflow.envs.ecosystems.gym_env:GymTextEnv", "env_name", "gymnasium",
                  "gymnasium", "Any registered Gymnasium env with text observations and actions"),
    )
}  # fmt: skip


def family_spec(env_id: str) -> EnvSpec | None:
    """The adapter spec of a ``PREFIX:NAME`` id, or None when the prefix is no family's."""
    prefix, sep, name = env_id.partition(":")
    family = FAMILIES.get(prefix)
    if not sep or family is None:
        return None
    if not name:
        raise ValueError(f"env id {env_id!r}: expected {prefix}:NAME ({family.description})")
    return EnvSpec(
        id=env_id,
        entry_point=family.entry_point,
        family=family.prefix,
        description=family.description,
        source=family.distribution,
        kwargs={family.name_kwarg: name},
    )


def require(prefix: str) -> ModuleType:
    """The family's outside package, imported now; missing, an error naming what to install."""
    family = FAMILIES[prefix]
    try:
        return importlib.import_module(family.module)
    except ImportError as exc:
        raise ImportError(
            f"{prefix}:* envs need the {family.distribution!r} package ({exc}); install it with "
            f"pip install 'astraflow[{EXTRA}]' or pip install {family.distribution}"
        ) from exc
