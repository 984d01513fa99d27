"""Sandboxes for running model-written code: Docker, bubblewrap, or a plain rlimited process.

``select_backend()`` picks the strongest one available; every backend returns a :class:`RunResult`.
"""

from envs.code.sandbox.base import Limits, RunResult, Sandbox, SandboxError
from envs.code.sandbox.image import IMAGE, build_image
from envs.code.sandbox.select import (
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
