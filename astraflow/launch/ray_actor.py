"""The Ray actor behind each service of a Ray run: it runs and watches one service process.

Why a process inside an actor rather than the service as the actor itself: the actor runs exactly
the ``python -m astraflow.cli.main serve ...`` command the local launcher runs (same logs, checkpoints,
restarts, signals), so a service behaves the same under both launchers; Ray only decides where
it runs and reserves what it asks for. The process dies with the actor (``PR_SET_PDEATHSIG``,
:mod:`astraflow.launch.processes`), so killing the actor kills the service.

This module imports no Ray: :func:`ray_service_actor` wraps the class with ``ray.remote`` when a
Ray launcher needs it.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from astraflow.launch.processes import Service

#: Placeholders in a service's argv that the actor fills in on the host it was placed on.
PYTHON = "{python}"
NODE_IP = "{node_ip}"
#: Placeholder in a service's environment: the GPUs Ray reserved for the actor, as
#: ``CUDA_VISIBLE_DEVICES`` (the launch plan's value for a Ray service on GPUs,
#: ``astraflow.launch.plan.RAY_GPUS``).
RAY_GPUS = "{ray_gpus}"


def _node_ip() -> str:
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # outside Ray (tests of this class): this host's address
        return socket.gethostbyname(socket.gethostname())


def _ray_gpus() -> str:
    """The GPUs Ray reserved for this actor, as ``CUDA_VISIBLE_DEVICES`` ("" when none)."""
    try:
        import ray

        return ",".join(str(g) for g in ray.get_gpu_ids())
    except Exception:  # outside Ray (tests of this class): what this process was given
        return os.environ.get("CUDA_VISIBLE_DEVICES", "")


class ServiceProcess:
    """One service process on the host this actor was placed on.

    ``env`` holds only what the launcher sets for the service (token, threads, TLS files, and
    ``CUDA_VISIBLE_DEVICES = RAY_GPUS`` for a service on GPUs, which becomes the GPUs Ray
    reserved for this actor); the rest is this host's environment, so host-specific variables
    (``PATH``) stay right; ``unset`` names variables to remove."""

    def __init__(
        self, name: str, argv: list[str], log_path: str, env: dict[str, str], unset: list[str]
    ):
        self.node_ip = _node_ip()
        fill = {PYTHON: sys.executable, NODE_IP: self.node_ip}
        full_env = {k: v for k, v in os.environ.items() if k not in set(unset)}
        full_env.update(env)
        if full_env.get("CUDA_VISIBLE_DEVICES") == RAY_GPUS:
            full_env["CUDA_VISIBLE_DEVICES"] = _ray_gpus()
        self.service = Service(name, [fill.get(a, a) for a in argv], Path(log_path))
        self.service.start(full_env)

    def info(self) -> dict:
        """Where the service runs: its PID, the actor's, the host and Ray node (with labels)."""
        node_id, labels = "", {}
        try:
            import ray

            ctx = ray.get_runtime_context()
            node_id = ctx.get_node_id()
            labels = {k: v for k, v in ctx.get_node_labels().items() if not k.startswith("ray.io/")}
        except Exception:  # outside Ray, or a Ray without node labels
            pass
        return {
            "pid": self.service.pid,
            "actor_pid": os.getpid(),
            "node_ip": self.node_ip,
            "node_id": node_id,
            "node_labels": labels,
        }

    def poll(self) -> int | None:
        """The process's exit code, None while it runs."""
        return self.service.returncode()

    def stop(self, timeout: float) -> int | None:
        return self.service.stop(timeout)

    def drain(self) -> None:
        """One SIGTERM, no wait (a rollout node drains; the launcher polls for the exit)."""
        self.service.drain()


def ray_service_actor():
    """``ServiceProcess`` as a Ray actor class (Ray imported here, on demand)."""
    import ray

    return ray.remote(ServiceProcess)
