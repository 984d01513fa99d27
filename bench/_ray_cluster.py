"""A local 2-node Ray cluster on this machine, for the Ray launcher's test and scaling bench.

Two ``ray start --block`` processes, each in its own session: a head and a second node standing
for another host (its own custom resource and label, so a recipe can place services on it). Each
is stopped by signalling its own process group, never by name (``ray stop`` would stop every Ray
on the machine). Sized small (a few logical CPUs each, no dashboard) for a shared 2-core machine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

#: The second node's custom resource and label (what recipes place rollout nodes by).
SECOND_NODE_RESOURCE = "rollout_host"
SECOND_NODE_LABEL = ("region", "us-west")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_cli() -> list[str]:
    exe = shutil.which(
        "ray", path=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"]
    )
    return [exe] if exe else [sys.executable, "-m", "ray.scripts.scripts"]


@dataclass
class LocalRayCluster:
    address: str = ""
    procs: list[subprocess.Popen] = field(default_factory=list)
    temp_dir: str = ""

    @classmethod
    def start(cls, head_cpus: int = 2, second_cpus: int = 2, second_slots: int = 8,
              timeout_s: float = 120.0) -> LocalRayCluster:  # fmt: skip
        cluster = cls(temp_dir=tempfile.mkdtemp(prefix="afray", dir="/tmp"))
        port = _free_port()
        cluster.address = f"127.0.0.1:{port}"
        common = ["--block", "--disable-usage-stats", "--include-log-monitor=false"]
        head = [*_ray_cli(), "start", "--head", "--node-ip-address", "127.0.0.1",
                f"--port={port}", f"--num-cpus={head_cpus}", "--num-gpus=0",
                "--include-dashboard=false", f"--temp-dir={cluster.temp_dir}", *common]  # fmt: skip
        label = "=".join(SECOND_NODE_LABEL)
        second = [*_ray_cli(), "start", f"--address={cluster.address}",
                  "--node-ip-address", "127.0.0.1", f"--num-cpus={second_cpus}", "--num-gpus=0",
                  f"--resources={json.dumps({SECOND_NODE_RESOURCE: second_slots})}",
                  f"--labels={label}", *common]  # fmt: skip
        # a throwaway cluster on loopback: no token auth (see .ci/run)
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
        log = open(Path(cluster.temp_dir) / "ray-start.log", "ab")
        try:
            cluster.procs.append(_spawn(head, env, log))
            cluster._wait_nodes(1, timeout_s)
            cluster.procs.append(_spawn(second, env, log))
            cluster._wait_nodes(2, timeout_s)
        except BaseException:
            cluster.stop()
            raise
        finally:
            log.close()
        return cluster

    def _wait_nodes(self, n: int, timeout_s: float) -> None:
        """Until ``n`` nodes are alive (asked with the ``ray`` CLI's status, bounded)."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"ray start exited ({p.returncode}); see {self.temp_dir}")
            out = subprocess.run(
                [*_ray_cli(), "status", f"--address={self.address}"],
                capture_output=True, text=True, timeout=60,
                env={**os.environ, "RAY_AUTH_MODE": "disabled"},
            )  # fmt: skip
            if out.returncode == 0 and out.stdout.count(" node_") >= n:
                return
            time.sleep(1.0)
        raise TimeoutError(f"local Ray cluster: {n} node(s) not up within {timeout_s:.0f}s")

    def stop(self) -> None:
        """SIGTERM each ``ray start --block`` group (second node first), then SIGKILL leftovers."""
        for p in reversed(self.procs):
            _signal_group(p.pid, signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                pass
            _signal_group(p.pid, signal.SIGKILL)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self.procs.clear()
        if self.temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)


def _spawn(argv: list[str], env: dict[str, str], log) -> subprocess.Popen:
    return subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        start_new_session=True,
    )  # fmt: skip


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
