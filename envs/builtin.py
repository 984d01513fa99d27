"""Specs of the environments that ship with AstraFlow (entry point ``astraflow.envs: builtin``).

Each family module exposes ``SPECS``; importing them is cheap because env classes are loaded lazily
by entry point string.
"""

from __future__ import annotations

import importlib

from astraflow.envs.registry import EnvSpec

FAMILIES = (
    "astraflow.envs.math",
    "astraflow.envs.code",
    "astraflow.envs.search",
    "astraflow.envs.agentbench",
    "astraflow.envs.tools",
)


def register() -> list[EnvSpec]:
    specs: list[EnvSpec] = []
    for name in FAMILIES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # family not built yet
                continue
            raise
        specs.extend(getattr(module, "SPECS", []))
    return specs
