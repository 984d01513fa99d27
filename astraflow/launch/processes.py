"""Child processes of a local run: start with logs to files, stop by PID, never orphan.

Children get ``PR_SET_PDEATHSIG`` so they die with the launcher even if it is SIGKILLed, and each
runs in its own session so a terminal's Ctrl-C reaches only the launcher, which then stops them in
order (nodes, trainers, dataflow).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def service_env(
    token: str, threads: int = 1, extra: dict[str, str] | None = None
) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "ASTRAFLOW_TOKEN": token,
            "OMP_NUM_THREADS": str(threads),
            "MKL_NUM_THREADS": str(threads),
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
            "HF_HUB_OFFLINE": env.get("HF_HUB_OFFLINE", "1"),
            "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
            # the folder `astraflow train` runs in stays off the services' import path: a user's
            # own `tasks/` or `addten/` folder there must not shadow an installed package
            # (what plugins need is installed or on PYTHONPATH, which still applies)
            "PYTHONSAFEPATH": "1",
        }
    )
    env.update(extra or {})
    return env


@dataclass
class Service:
    name: str
    argv: list[str]
    log_path: Path
    proc: subprocess.Popen | None = None
    started_at: float = field(default_factory=time.time)
    #: the launcher had to SIGKILL it (it did not stop within its timeout after SIGTERM)
    killed: bool = False

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self, env: dict[str, str], cwd: Path | None = None) -> Service:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab", buffering=0)
        self.proc = subprocess.Popen(
            self.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        log.close()
        self.started_at = time.time()
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, wait, then SIGKILL the process group."""
        self.terminate()
        return self.wait_stopped(timeout)

    def terminate(self) -> None:
        """Ask the service to stop (SIGTERM to its group); :meth:`wait_stopped` waits for it, so
        a launcher can ask several services at once and wait for them together."""
        if self.proc is not None and self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGTERM)

    def drain(self) -> None:
        """Ask a rollout node to leave cleanly (one SIGTERM: it finishes or hands back its
        groups); the caller polls :meth:`returncode` for the exit."""
        self.terminate()

    def wait_stopped(self, timeout: float = 20.0) -> int | None:
        """Wait for the exit asked by :meth:`terminate`; SIGKILL only past ``timeout``."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
                self.killed = True
        # anything the service itself left in its group
        _signal_group(self.proc.pid, signal.SIGKILL)
        return self.proc.returncode

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def astraflow_argv(*args: str) -> list[str]:
    """Run a CLI command with the same interpreter (works without the console script on PATH)."""
    return [sys.executable, "-m", "astraflow.cli.main", *args]
