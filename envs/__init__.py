"""Gymnasium environments for agentic RL (math, code, search, agentbench) and their registry."""

from astraflow.envs.base import TaskError, TextEnv
from astraflow.envs.registry import (
    EnvRegistry,
    EnvSpec,
    UnknownEnvError,
    default_registry,
    make_env,
)

__all__ = [
    "TaskError",
    "TextEnv",
    "EnvRegistry",
    "EnvSpec",
    "UnknownEnvError",
    "default_registry",
    "make_env",
]
