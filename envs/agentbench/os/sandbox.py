"""Throw-away Linux systems for OS-interaction tasks: a root-filesystem overlay or a Docker container.

Each task gets a fresh system that its init scripts may change freely (they write to ``/usr``,
``/etc``, ``/var``), so a read-only root is not enough. Two backends:

* ``overlay`` (no Docker needed): a private mount namespace (``unshare``) holds a tmpfs with an
  overlayfs whose lower layer is the host's ``/``; bubblewrap then builds the sandbox root from the
  system directories of that overlay (``/usr``, ``/etc``, ``/var``), with fresh empty ``/root``,
  ``/home``, ``/tmp``, ``/run``, ``/opt``, ``/srv``, ``/mnt`` and ``/media`` (the host's own files
  there stay hidden), a new PID, IPC, UTS and network namespace (loopback only) and Docker's
  default capability set. Every write lands in the tmpfs, which disappears with
  the namespace. Needs root (overlayfs mounts) and bubblewrap; bubblewrap 0.8 has no ``--overlay``
  option, hence the mount namespace around it.
* ``docker``: a container of an image built locally from AgentBench's own Dockerfiles
  (``os_interaction/res/dockerfiles``), without network.

Both run :mod:`astraflow.envs.agentbench.os.supervisor` inside the system, so the shell protocol is identical.

Built on the shared sandbox package (:mod:`astraflow.envs.sandbox`, also the code env's): one
:class:`~astraflow.envs.sandbox.base.SandboxError` for both, and the bwrap arguments of the host's top-level
directories from :func:`astraflow.envs.sandbox.bwrap.top_level_binds`. The runs differ in kind — a code run is
one process to completion, an OS task a long-lived system driven command by command — so the
backends themselves stay separate classes.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from astraflow.envs.sandbox.base import SandboxError
from astraflow.envs.sandbox.bwrap import top_level_binds

SUPERVISOR_SOURCE = (Path(__file__).with_name("supervisor.py")).read_text(encoding="utf-8")

#: Top-level host directories exposed (as writable overlay) inside the overlay sandbox.
SYSTEM_DIRS = (
    "usr",
    "etc",
    "var",
    "bin",
    "sbin",
    "lib",
    "lib32",
    "lib64",
    "libx32",
)
#: Fresh empty directories (tmpfs) like a new container's; the host's /opt, /srv ... stay hidden.
EMPTY_DIRS = ("root", "home", "tmp", "run", "opt", "srv", "mnt", "media")
#: Docker's default capabilities (minus NET_RAW): what a root process in a container may do.
DOCKER_CAPS = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
)


@dataclass
class ExecResult:
    output: bytes
    exit_code: int
    timed_out: bool = False
    restarted: bool = False

    @property
    def text(self) -> str:
        return self.output.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class Capabilities:
    """What tasks may rely on in a backend (tasks needing more are skipped, not failed)."""

    users: bool
    network: bool


class Sandbox:
    """A running system with a supervisor reachable through the pipes of ``self._proc``."""

    backend = "base"
    capabilities = Capabilities(users=True, network=False)

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    # --- protocol -------------------------------------------------------------------------------
    def _request(self, req: dict, timeout: float) -> ExecResult:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            raise SandboxError(f"{self.backend} sandbox is not running")
        with self._lock:
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write((json.dumps(req) + "\n").encode())
                proc.stdin.flush()
            except BrokenPipeError as exc:
                raise SandboxError(f"{self.backend} sandbox stopped: {self._stderr()}") from exc
            line = _readline_with_timeout(proc, timeout + 15)
        if not line:
            raise SandboxError(f"{self.backend} sandbox did not answer: {self._stderr()}")
        reply = json.loads(line)
        return ExecResult(
            base64.b64decode(reply["output"]),
            int(reply["exit"]),
            bool(reply.get("timed_out")),
            bool(reply.get("restarted")),
        )

    def _stderr(self) -> str:
        err = getattr(self, "_err", None)
        if err is None:
            return ""
        try:
            err.seek(0)
            return err.read().decode("utf-8", "replace")[-2000:]
        except (OSError, ValueError):
            return ""

    def shell(self, command: str, timeout: float = 30.0) -> ExecResult:
        """Run ``command`` in the task's persistent shell (state carries over between calls)."""
        return self._request({"op": "shell", "cmd": command, "timeout": timeout}, timeout)

    def run(self, argv: list[str], timeout: float = 60.0) -> ExecResult:
        """Run an independent process in the system (cwd ``/``, clean environment)."""
        return self._request({"op": "exec", "argv": list(argv), "timeout": timeout}, timeout)

    def _start_supervisor(self, argv: list[str]) -> None:
        self._err = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            start_new_session=True,
        )
        try:
            self._request({"op": "ping"}, 30)
        except SandboxError:
            self.close()
            raise

    def close(self) -> None:
        """Stop the system; safe from any thread.

        Called while a command runs (another thread is inside :meth:`shell` / :meth:`run`, e.g.
        the node's env runner closing an env whose step timed out) it kills the supervisor's whole
        process group at once: the supervisor reads no request while a command runs, so closing
        its stdin would only be noticed when the command ends. The ``overlay`` system dies with
        its supervisor (``--die-with-parent``, PID namespace); the ``docker`` one is removed."""
        proc, self._proc = self._proc, None
        if proc is not None:
            busy = self._lock.locked()
            if busy:
                _kill_group(proc)
            try:
                if proc.stdin:
                    proc.stdin.close()
            except OSError:
                pass
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
            if proc.stdout:
                proc.stdout.close()
        err, self._err = getattr(self, "_err", None), None
        if err is not None:
            err.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # last resort; callers close explicitly
        try:
            self.close()
        except Exception:
            pass


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the supervisor's process group (it leads its own session) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait(timeout=10)


def _readline_with_timeout(proc: subprocess.Popen, timeout: float) -> bytes:
    """One reply line, or b"" when the supervisor is silent for ``timeout`` seconds (then killed)."""
    result: list[bytes] = []
    reader = threading.Thread(target=lambda: result.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if reader.is_alive():
        proc.kill()
        reader.join(5)
        return b""
    return result[0] if result else b""


class OverlaySandbox(Sandbox):
    """Writable overlay of the host's system directories inside bubblewrap (see module doc)."""

    backend = "overlay"
    capabilities = Capabilities(users=True, network=False)

    def __init__(self, tmpfs_size: str = "2g", python: str = "/usr/bin/python3") -> None:
        super().__init__()
        self._dir = tempfile.mkdtemp(prefix="astraflow-os-")
        binds = top_level_binds(SYSTEM_DIRS, lambda path: ["--bind", f"$W/root{path}", path])
        for name in EMPTY_DIRS:
            binds += ["--tmpfs", f"/{name}"]
        caps: list[str] = ["--cap-drop", "ALL"]
        for cap in DOCKER_CAPS:
            caps += ["--cap-add", cap]
        bwrap = [
            "bwrap",
            *binds,
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--ro-bind",
            "/sys",
            "/sys",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-net",
            "--unshare-cgroup-try",
            "--hostname",
            "sandbox",
            "--die-with-parent",
            "--new-session",
            "--clearenv",
            "--setenv",
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--chdir",
            "/",
            *caps,
            python,
            "-u",
            "-c",
            SUPERVISOR_SOURCE,
        ]
        # The shell script only mounts and execs; "$W" is quoted, every other word is literal.
        quoted = " ".join(
            '"$W' + a[2:] + '"' if a.startswith("$W") else shlex.quote(a) for a in bwrap
        )
        script = (
            "set -e\n"
            f'mount -t tmpfs -o size={tmpfs_size},mode=755 astraflow-os "$W"\n'
            'mkdir "$W/upper" "$W/work" "$W/root"\n'
            'mount -t overlay overlay -o "lowerdir=/,upperdir=$W/upper,workdir=$W/work" "$W/root"\n'
            f"exec {quoted}\n"
        )
        argv = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "/bin/sh",
            "-c",
            'W="$1"\n' + script,
            "sh",
            self._dir,
        ]
        self._start_supervisor(argv)

    def close(self) -> None:
        super().close()
        d, self._dir = getattr(self, "_dir", None), None
        if d:
            shutil.rmtree(d, ignore_errors=True)


class DockerSandbox(Sandbox):
    """A fresh container (no network) of a locally built AgentBench OS image."""

    backend = "docker"
    capabilities = Capabilities(users=True, network=False)

    def __init__(self, image: str) -> None:
        super().__init__()
        out = subprocess.run(
            [
                "docker",
                "run",
                "-d",
                "--rm",
                "--network",
                "none",
                "--entrypoint",
                "sleep",
                image,
                "infinity",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if out.returncode != 0:
            raise SandboxError(f"docker run {image} failed: {out.stderr.strip()}")
        self.container = out.stdout.strip()
        self._start_supervisor(
            ["docker", "exec", "-i", self.container, "python3", "-u", "-c", SUPERVISOR_SOURCE]
        )

    def close(self) -> None:
        super().close()
        cid, self.container = getattr(self, "container", None), None
        if cid:
            subprocess.run(["docker", "rm", "-f", cid], capture_output=True, timeout=60)


def docker_available() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        out = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and bool(out.stdout.strip())


def ensure_docker_image(dockerfiles: Path, name: str = "default") -> str:
    """Tag of AgentBench's image ``name``, built from ``dockerfiles/name`` when missing."""
    tag = f"astraflow-agentbench-os/{name}:latest"
    probe = subprocess.run(["docker", "image", "inspect", tag], capture_output=True, timeout=30)
    if probe.returncode == 0:
        return tag
    dockerfile = dockerfiles / name
    if not dockerfile.is_file():
        raise SandboxError(f"no Dockerfile {dockerfile} to build image {tag} from")
    with tempfile.TemporaryDirectory() as ctx:
        shutil.copy(dockerfile, Path(ctx) / "Dockerfile")
        out = subprocess.run(
            ["docker", "build", "-t", tag, ctx], capture_output=True, text=True, timeout=1800
        )
    if out.returncode != 0:
        raise SandboxError(f"docker build of {tag} failed: {out.stderr.strip()[-2000:]}")
    return tag


def overlay_problem() -> str | None:
    """Why the overlay backend cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "the overlay sandbox needs root (overlayfs mounts in a private mount namespace)"
    for tool in ("bwrap", "unshare", "mount"):
        if shutil.which(tool) is None:
            return (
                f"the overlay sandbox needs `{tool}` (apt-get install bubblewrap util-linux mount)"
            )
    if not Path("/usr/bin/python3").exists():
        return "the overlay sandbox needs /usr/bin/python3 on the host"
    return _overlay_probe()


@functools.lru_cache(maxsize=1)
def _overlay_probe() -> str | None:
    """Start one overlay sandbox (~0.2 s) to learn whether mounts are allowed here; once a process."""
    try:
        with OverlaySandbox() as box:
            if box.shell("true", timeout=10).exit_code != 0:
                return "the overlay sandbox starts but its shell fails"
    except (SandboxError, OSError) as exc:
        return f"the overlay sandbox cannot start here: {exc}"
    return None


@dataclass(frozen=True)
class SandboxFactory:
    """Makes sandboxes of one backend; ``describe`` says which, for reports."""

    backend: str
    image: str | None = None

    def __call__(self) -> Sandbox:
        if self.backend == "overlay":
            return OverlaySandbox()
        if self.backend == "docker":
            assert self.image is not None
            return DockerSandbox(self.image)
        raise SandboxError(f"unknown sandbox backend {self.backend!r}; expected overlay or docker")

    @property
    def capabilities(self) -> Capabilities:
        return (
            OverlaySandbox.capabilities if self.backend == "overlay" else DockerSandbox.capabilities
        )


def select_sandbox(backend: str = "auto", dockerfiles: Path | None = None) -> SandboxFactory:
    """Pick a backend: ``docker`` when an engine answers (image built locally), else ``overlay``.

    ``auto`` falls back to the overlay when the image cannot be built (e.g. no network for apt).
    """
    if backend not in ("auto", "overlay", "docker"):
        raise SandboxError(f"sandbox backend must be auto, overlay or docker, got {backend!r}")
    errors: list[str] = []
    if backend in ("auto", "docker"):
        if docker_available():
            try:
                if dockerfiles is None:
                    raise SandboxError("no dockerfiles directory given to build the image from")
                return SandboxFactory("docker", ensure_docker_image(dockerfiles))
            except (SandboxError, subprocess.TimeoutExpired) as exc:
                errors.append(str(exc))
        else:
            errors.append("no Docker engine answers")
        if backend == "docker":
            raise SandboxError("docker sandbox unavailable: " + "; ".join(errors))
    problem = overlay_problem()
    if problem is None:
        return SandboxFactory("overlay")
    errors.append(problem)
    raise SandboxError("no OS sandbox available: " + "; ".join(errors))
