"""The ``bwrap`` backend: bubblewrap with every namespace unshared and no network.

The sandbox sees only read-only binds of the system's ``/usr`` (plus the ``/lib*``, ``/bin``
symlinks or dirs and the dynamic-linker config from ``/etc``), a fresh ``/proc``, a minimal
``/dev``, a tmpfs ``/tmp`` and a private writable ``/work``. Host homes, ``/root``, ``/work``,
``/tmp`` and ``/etc`` secrets are never bound. When we run as root the sandbox is started as the
``nobody`` uid (unprivileged user namespace), so even a kernel-level escape lands unprivileged.
The python inside is the system one (``/usr/bin/python3``), not a pyenv/venv from a home dir.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping

from astraflow.envs.sandbox.base import (
    SANDBOX_WORKDIR,
    Limits,
    RunResult,
    Sandbox,
    SandboxError,
    prepare_run,
)
from astraflow.envs.sandbox.local import NOBODY, populate_workdir, run_local

SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/localtime",
)


#: Top-level directories that are symlinks into /usr on merged-/usr systems, directories otherwise.
ROOT_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


def top_level_binds(names: Iterable[str], bind: Callable[[str], list[str]]) -> list[str]:
    """bwrap arguments recreating the host's top-level ``names`` in a sandbox root: a symlink
    stays the same symlink, a directory gets ``bind("/name")``, a missing name is left out.

    Shared with the AgentBench OS sandbox (:mod:`astraflow.envs.agentbench.os.sandbox`), which binds the
    directories from a writable overlay instead of read-only from the host."""
    args: list[str] = []
    for name in names:
        path = "/" + name.strip("/")
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += bind(path)
    return args


def _root_links() -> list[str]:
    """Binds for /bin, /lib, /lib64, /sbin: symlinks on merged-/usr systems, dirs otherwise."""
    return top_level_binds(ROOT_LINKS, lambda path: ["--ro-bind", path, path])


class BwrapSandbox(Sandbox):
    name = "bwrap"
    isolated = True

    def __init__(
        self, bwrap: str | None = None, python: str = "/usr/bin/python3", use_cgroup: bool = True
    ):
        self.use_cgroup = use_cgroup
        self.bwrap = bwrap or shutil.which("bwrap")
        if not self.bwrap:
            raise SandboxError("bubblewrap (`bwrap`) is not installed; apt-get install bubblewrap")
        if not os.access(python, os.X_OK) or not python.startswith("/usr/"):
            raise SandboxError(
                f"bwrap backend needs a system python under /usr, {python!r} is not one"
            )
        self.python = python
        self.drop_to_nobody = os.getuid() == 0

    def argv(self, workdir: str, command: list[str]) -> list[str]:
        args = [
            self.bwrap,
            "--unshare-all",
            "--die-with-parent",
            "--new-session",
            "--hostname",
            "sandbox",
            "--ro-bind",
            "/usr",
            "/usr",
            *_root_links(),
        ]
        for path in ETC_FILES:
            args += ["--ro-bind-try", path, path]
        args += [
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--tmpfs",
            "/tmp",
            "--bind",
            workdir,
            SANDBOX_WORKDIR,
            "--remount-ro",
            "/",
            "--chdir",
            SANDBOX_WORKDIR,
            "--uid",
            str(NOBODY[0]),
            "--gid",
            str(NOBODY[1]),
            "--clearenv",
            "--setenv",
            "PATH",
            SANDBOX_PATH,
            "--setenv",
            "HOME",
            SANDBOX_WORKDIR,
            "--setenv",
            "TMPDIR",
            "/tmp",
            "--setenv",
            "LANG",
            "C.UTF-8",
            "--setenv",
            "PYTHONDONTWRITEBYTECODE",
            "1",
            "--setenv",
            "PYTHONIOENCODING",
            "utf-8",
            "--",
        ]
        return args + command

    def probe(self) -> None:
        """Raise :class:`SandboxError` unless a trivial sandboxed run works on this host."""
        result = self.run("print('ok')", limits=Limits(wall_time_s=10))
        if result.stdout.strip() != "ok":
            raise SandboxError(
                f"bwrap probe failed (exit {result.exit_code}): {result.stderr[-500:]}"
            )

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
        workdir = tempfile.mkdtemp(prefix="astraflow-bwrap-")
        abort = self.begin_run()
        user = NOBODY if self.drop_to_nobody else None
        try:
            populate_workdir(workdir, req.files, user)
            try:
                result = run_local(
                    self.argv(workdir, req.argv),
                    cwd="/",
                    env={"PATH": SANDBOX_PATH},
                    stdin=req.stdin,
                    limits=req.limits,
                    backend=self.name,
                    use_cgroup=self.use_cgroup,
                    user=user,
                    abort=abort,
                    signal_exit_offset=True,
                )
            except (OSError, subprocess.SubprocessError) as exc:
                raise SandboxError(f"could not start bwrap: {exc}") from exc
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
            self.end_run(abort)
        if result.exit_code == 1 and result.stderr.startswith("bwrap:"):
            raise SandboxError(f"bwrap failed to set up the sandbox: {result.stderr.strip()[:500]}")
        return result
