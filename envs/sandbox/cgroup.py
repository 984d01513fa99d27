"""A per-run cgroup that caps the number of processes and can kill every one of them.

Why: rlimits cannot bound a fork bomb when the host runs as root (root is exempt from
RLIMIT_NPROC), and a process that calls ``setsid`` escapes process-group kills. A pids cgroup solves
both: ``pids.max`` stops the bomb and ``cgroup.procs`` lists every survivor to kill. It is used when
the host lets us create one (root, cgroup v1 ``pids`` hierarchy or cgroup v2 with the pids
controller); otherwise backends fall back to rlimits and process-group kills.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

PARENT = "astraflow-sandbox"


def _pids_root() -> tuple[Path, int] | None:
    v1 = Path("/sys/fs/cgroup/pids")
    if (v1 / "cgroup.procs").exists() and os.access(v1, os.W_OK):
        return v1, 1
    v2 = Path("/sys/fs/cgroup")
    controllers = v2 / "cgroup.controllers"
    if (
        controllers.exists()
        and "pids" in controllers.read_text().split()
        and os.access(v2, os.W_OK)
    ):
        return v2, 2
    return None


class PidsCgroup:
    """One cgroup for one run; create with :meth:`create`, always :meth:`destroy`."""

    def __init__(self, path: Path, version: int):
        self.path = path
        self.version = version

    @classmethod
    def create(cls, max_pids: int) -> PidsCgroup | None:
        """A fresh cgroup limited to ``max_pids`` processes, or None when not permitted here."""
        root = _pids_root()
        if root is None:
            return None
        base, version = root
        try:
            parent = base / PARENT
            parent.mkdir(exist_ok=True)
            if version == 2:
                (parent / "cgroup.subtree_control").write_text("+pids")
            path = parent / uuid.uuid4().hex[:16]
            path.mkdir()
            (path / "pids.max").write_text(str(max_pids))
            return cls(path, version)
        except OSError:
            return None

    def attach_pid_file(self) -> str:
        """Path to write a pid into (done by the child before exec)."""
        return str(self.path / "cgroup.procs")

    def pids(self) -> list[int]:
        try:
            return [int(x) for x in (self.path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def kill_all(self, timeout_s: float = 5.0) -> list[int]:
        """SIGKILL every process in the cgroup until it is empty; returns pids still alive."""
        kill_file = self.path / "cgroup.kill"
        deadline = time.monotonic() + timeout_s
        while True:
            pids = self.pids()
            if not pids:
                return []
            if kill_file.exists():
                try:
                    kill_file.write_text("1")
                except OSError:
                    pass
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            if time.monotonic() > deadline:
                return self.pids()
            time.sleep(0.01)

    def destroy(self) -> None:
        self.kill_all()
        for _ in range(100):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.02)
