"""Helpers for the dataflow tests: recipes, episodes, and real services on loopback.

``ThreadedService`` runs the real app under uvicorn in a background thread (real HTTP on
127.0.0.1); ``ServiceProcess`` runs ``astraflow serve dataflow`` as a child process, for tests that
kill -9 it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from astraflow.tasks.catalog import load_task_set

from astraflow.dataflow.config import ServiceConfig
from astraflow.dataflow.http.app import create_app
from astraflow.protocol import Episode, Trajectory
from astraflow.protocol.http_server import HTTPServer
from astraflow.recipe import Recipe, recipe_to_toml

TOKEN = "test-token-123"
REPO = Path(__file__).resolve().parents[2]


def make_recipe(tmp_path: Path, **sections: Any) -> Recipe:
    """A small arithmetic recipe; ``sections`` are merged into the defaults."""
    data: dict[str, Any] = {
        "run": {"name": "t", "output_dir": str(tmp_path / "runs"), "max_steps": 5},
        "policies": {"policy": {"model": "builtin:tiny-arith", "trainer": {"groups_per_step": 2}}},
        "tasks": {"group_size": 4},
        # no backpressure unless a test asks for it: tests lease far ahead of any trainer
        "dataflow": {"lease_timeout_s": 30.0, "buffer_steps": 0},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return Recipe.model_validate(data)


class ManualClock:
    """Service time (``ServiceConfig.clock``) that moves only when a test says so, and can be
    made to fail: lease deadlines and silences pass without the test sleeping through them."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start
        self.broken = False

    def __call__(self) -> float:
        if self.broken:
            raise RuntimeError("clock source unavailable")
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def trajectory(role: str = "agent", n: int = 12, version: int = 0, prompt: int = 4) -> Trajectory:
    gen = n - prompt
    return Trajectory(
        role=role,
        tokens=list(range(100, 100 + n)),
        loss_mask=[0] * prompt + [1] * gen,
        logprobs=[0.0] * prompt + [-0.25] * gen,
        versions=[-1] * prompt + [version] * gen,
    )


def episode(
    task_id: str,
    reward: float = 1.0,
    roles=("agent",),
    version: int = 0,
    error: str | None = None,
    n: int = 12,
) -> Episode:
    if error is not None:
        return Episode(task_id=task_id, finish_reason="error", error=error)
    return Episode(
        task_id=task_id,
        trajectories=[trajectory(r, n=n, version=version) for r in roles],
        rewards={r: reward for r in roles},
    )


def group(task_id: str, rewards: list[float], **kw) -> list[Episode]:
    return [episode(task_id, reward=r, **kw) for r in rewards]


class ThreadedService:
    """The real app on a loopback port, served by uvicorn in a background thread (HTTPS when
    given a :class:`~astraflow.protocol.tls.ServerTLS`)."""

    def __init__(
        self, recipe: Recipe, store: Path, token: str = TOKEN, *, tls=None, **app_kwargs
    ) -> None:
        config = app_kwargs.pop("config", None) or ServiceConfig.from_recipe(
            recipe, **app_kwargs.pop("config_kwargs", {})
        )
        app_kwargs.setdefault("task_source", load_task_set)
        self.app = create_app(recipe, store, token, config=config, **app_kwargs)
        self.service = self.app.state.service
        self.http = HTTPServer(self.app, tls=tls, lifespan="on", name="dataflow-service")
        self.url = self.http.url

    def __enter__(self) -> ThreadedService:
        self.http.start_in_thread()
        return self

    def __exit__(self, *exc) -> None:
        self.http.stop_thread(timeout=30)


class ServiceProcess:
    """``astraflow serve dataflow`` in a child process (so a test can kill -9 it)."""

    def __init__(
        self,
        recipe: Recipe,
        workdir: Path,
        store: Path,
        token: str = TOKEN,
        extra_args: list[str] | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.recipe_path = self.workdir / "recipe.toml"
        self.recipe_path.write_text(recipe_to_toml(recipe))
        self.store = Path(store)
        self.token = token
        self.extra_args = extra_args or []
        self.proc: subprocess.Popen | None = None
        self.url: str | None = None
        self.port: int = 0

    def start(self, timeout: float = 90.0) -> str:
        port_file = self.workdir / "port"
        port_file.unlink(missing_ok=True)
        env = {**os.environ, "ASTRAFLOW_TOKEN": self.token, "PYTHONUNBUFFERED": "1"}
        cmd = [
            sys.executable,
            "-m",
            "astraflow.cli.main",
            "serve",
            "dataflow",
            "--recipe",
            str(self.recipe_path),
            "--store",
            str(self.store),
            "--port-file",
            str(port_file),
            "--port",
            str(self.port),
            *self.extra_args,
        ]
        self.log = open(self.workdir / "service.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=self.log, stderr=subprocess.STDOUT
        )
        deadline = time.time() + timeout
        while not port_file.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"service exited with {self.proc.returncode}: "
                    f"{(self.workdir / 'service.log').read_text()[-2000:]}"
                )
            if time.time() > deadline:
                self.kill()
                raise RuntimeError("service did not write its port file in time")
            time.sleep(0.05)
        self.url = port_file.read_text().strip()
        self.port = int(self.url.rsplit(":", 1)[1])  # a restart reuses the port
        return self.url

    def kill(self) -> None:
        """SIGKILL: no shutdown handler runs, exactly like a crash."""
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.log.close()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        if not self.log.closed:
            self.log.close()

    def __enter__(self) -> ServiceProcess:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
