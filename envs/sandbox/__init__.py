"""Sandboxes for running model-written code: Docker, bubblewrap, or a plain rlimited process.

``select_backend()`` picks the strongest one available; every backend returns a :class:`RunResult`.
A package of its own (not under ``envs/code``) because two envs use it: the code env runs programs
here, and the AgentBench OS env's throw-away systems (:mod:`astraflow.envs.agentbench.os.sandbox`) share its
error type and bwrap helpers.
"""

from astraflow.envs.sandbox.base import Limits, RunResult, Sandbox, SandboxError
from astraflow.envs.sandbox.image import IMAGE, build_image
from astraflow.envs.sandbox.select import (
    CHOICES,
    ENV_VAR,
    available_backends,
    make_backend,
    select_backend,
)

__all__ = [
    "CHOICES",
    "ENV_VAR",
    "IMAGE",
    "Limits",
    "RunResult",
    "Sandbox",
    "SandboxError",
    "available_backends",
    "build_image",
    "make_backend",
    "select_backend",
]
