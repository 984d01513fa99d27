"""Choosing a sandbox backend: Docker when an engine answers and our image exists, else bubblewrap
when it works on this host, else the ``process`` backend with a loud warning.

Override with ``preferred`` (the code env's ``sandbox=`` kwarg) or the ``ASTRAFLOW_SANDBOX``
environment variable: ``docker``, ``bwrap``, ``process`` or ``auto``. An explicit choice that cannot
work raises :class:`SandboxError` instead of silently falling back.
"""

from __future__ import annotations

import logging
import os

from astraflow.envs.sandbox.base import Sandbox, SandboxError
from astraflow.envs.sandbox.image import IMAGE

ENV_VAR = "ASTRAFLOW_SANDBOX"
CHOICES = ("auto", "docker", "bwrap", "process")
log = logging.getLogger("astraflow.sandbox")

PROCESS_WARNING = (
    "NO SANDBOX ISOLATION: neither Docker (engine + image {image}) nor bubblewrap is usable here, so "
    "model-written code runs as a plain rlimited subprocess that can reach the network and the "
    "host filesystem. Install bubblewrap (apt-get install bubblewrap) or start Docker and run "
    "`astraflow envs build-sandbox-image`. Reasons: {reasons}"
)


def make_backend(name: str, *, image: str = IMAGE) -> Sandbox:
    """Construct one named backend; raises :class:`SandboxError` when it cannot run here."""
    if name == "docker":
        from astraflow.envs.sandbox.docker import DockerSandbox

        return DockerSandbox(image=image)
    if name == "bwrap":
        from astraflow.envs.sandbox.bwrap import BwrapSandbox

        box = BwrapSandbox()
        box.probe()
        return box
    if name == "process":
        from astraflow.envs.sandbox.process import ProcessSandbox

        return ProcessSandbox()
    raise ValueError(f"unknown sandbox backend {name!r}; expected one of {', '.join(CHOICES)}")


def available_backends(*, image: str = IMAGE) -> dict[str, str | None]:
    """Each backend -> None when usable here, else the reason it is not."""
    out: dict[str, str | None] = {}
    for name in ("docker", "bwrap", "process"):
        try:
            make_backend(name, image=image).close()
            out[name] = None
        except SandboxError as exc:
            out[name] = str(exc)
    return out


def select_backend(preferred: str | None = None, *, image: str = IMAGE) -> Sandbox:
    """The backend to use: ``preferred``, else ``$ASTRAFLOW_SANDBOX``, else automatic."""
    choice = (preferred or os.environ.get(ENV_VAR) or "auto").strip().lower()
    if choice not in CHOICES:
        source = "sandbox=" if preferred else f"${ENV_VAR}="
        raise ValueError(
            f"{source}{choice!r} is not a sandbox backend; expected one of {', '.join(CHOICES)}"
        )
    if choice != "auto":
        box = make_backend(choice, image=image)
        if choice == "process":
            log.warning(
                PROCESS_WARNING.format(image=image, reasons="process backend chosen explicitly")
            )
        return box
    reasons: list[str] = []
    for name in ("docker", "bwrap"):
        try:
            return make_backend(name, image=image)
        except SandboxError as exc:
            reasons.append(f"{name}: {exc}")
    log.warning(PROCESS_WARNING.format(image=image, reasons="; ".join(reasons)))
    return make_backend("process")
