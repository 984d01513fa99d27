"""The ``process`` backend: a plain child process with rlimits and a wall-clock kill.

NOT ISOLATION. The program shares the host's filesystem view and network; it only gets rlimits, a
private temp work dir, a pids cgroup when the host allows one, and (when we run as root) the
``nobody`` uid so it cannot read root-only files. Use it only where neither Docker nor bubblewrap
exists; :func:`astraflow.envs.sandbox.select.select_backend` warns loudly when it falls back to it.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Mapping

from astraflow.envs.sandbox.base import Limits, RunResult, Sandbox, prepare_run
from astraflow.envs.sandbox.local import NOBODY, populate_workdir, run_local

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"


def system_python() -> str | None:
    """A python3 outside any home directory (readable by an unprivileged uid)."""
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(cand, os.X_OK):
            return cand
    return None


class ProcessSandbox(Sandbox):
    name = "process"
    isolated = False

    def __init__(self, python: str | None = None, use_cgroup: bool = True):
        self.use_cgroup = use_cgroup
        self.drop_to_nobody = os.getuid() == 0
        default = system_python() if self.drop_to_nobody else sys.executable
        self.python = python or default or sys.executable

    def run(
        self,
        program: str | None = None,
        *,
        files: Mapping[str, str | bytes] | None = None,
        command: list[str] | None = None,
        stdin: str | bytes = b"",
        limits: Limits | None = None,
    ) -> RunResult:
        req = prepare_run(program, files, command, stdin, limits, python=self.python)
        workdir = tempfile.mkdtemp(prefix="astraflow-sbx-")
        abort = self.begin_run()
        user = NOBODY if self.drop_to_nobody else None
        try:
            populate_workdir(workdir, req.files, user)
            env = {
                "PATH": SAFE_PATH,
                "HOME": workdir,
                "TMPDIR": workdir,
                "LANG": "C.UTF-8",
                "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONIOENCODING": "utf-8",
            }
            result = run_local(
                req.argv,
                cwd=workdir,
                env=env,
                stdin=req.stdin,
                limits=req.limits,
                backend=self.name,
                use_cgroup=self.use_cgroup,
                user=user,
                abort=abort,
            )
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
            self.end_run(abort)
        result.details["isolated"] = False
        return result
