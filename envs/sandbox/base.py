"""The sandbox interface: run untrusted program text with limits, get a :class:`RunResult` back.

Why one interface: the code env (and AgentBench's OS tasks) must not care whether a run happens in
a Docker container, a bubblewrap namespace or a plain rlimited subprocess; backends differ in how
strong the isolation is (``Sandbox.isolated``), not in what they return.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO, ClassVar

from astraflow.errors import AstraFlowError

#: File the program text is written to inside the work dir.
MAIN_FILE = "main.py"
#: Working directory of the program inside an isolated sandbox.
SANDBOX_WORKDIR = "/work"


class SandboxError(AstraFlowError, RuntimeError):
    """The sandbox itself could not run (backend missing, image absent, engine down)."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one run. Memory is in MiB; output is per stream, in bytes."""

    wall_time_s: float = 10.0
    memory_mb: int = 512
    pids: int = 64
    cpus: float = 1.0
    output_bytes: int = 65_536
    file_size_mb: int = 16

    def __post_init__(self) -> None:
        for name in ("wall_time_s", "memory_mb", "pids", "cpus", "output_bytes", "file_size_mb"):
            if getattr(self, name) <= 0:
                raise ValueError(f"Limits.{name} must be > 0, got {getattr(self, name)!r}")


@dataclass
class RunResult:
    """What happened to one run.

    ``killed_reason`` is None for a run that exited on its own, else one of ``"timeout"`` (wall
    clock), ``"oom"``, ``"output_limit"`` (stdout/stderr over the cap), ``"closed"`` (the sandbox
    was closed while the program ran) or ``"signal:NAME"``.
    """

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    oom: bool = False
    killed_reason: str | None = None
    duration_s: float = 0.0
    backend: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    details: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.killed_reason is None

    def summary(self) -> dict:
        """JSON-able facts for an env's ``info`` (no output text)."""
        return {
            "backend": self.backend,
            "exit_code": self.exit_code,
            "timed_out": self.timed_out,
            "oom": self.oom,
            "killed_reason": self.killed_reason,
            "duration_s": round(self.duration_s, 3),
            "stdout_truncated": self.stdout_truncated,
            "stderr_truncated": self.stderr_truncated,
        }


class Sandbox(ABC):
    """Runs a Python program (or a command) on files in a fresh, private work dir."""

    #: Backend name: docker, bwrap or process.
    name: ClassVar[str] = ""
    #: False when the backend is not a security boundary (the ``process`` backend).
    isolated: ClassVar[bool] = True

    @abstractmethod
    def run(
        self,
        program: str | None = None,
        *,
        files: Mapping[str, str | bytes] | None = None,
        command: list[str] | None = None,
        stdin: str | bytes = b"",
        limits: Limits | None = None,
    ) -> RunResult:
        """Run ``program`` (written to ``main.py``) or ``command`` in a fresh work dir holding
        ``files``. ``command`` defaults to ``python3 main.py``. Never raises for anything the
        program does; raises :class:`SandboxError` only when the backend itself fails."""

    def close(self) -> None:
        """Kill every run in flight (from any thread) and release backend resources.

        Why from any thread: a rollout node runs ``run`` in a worker thread and, when the env call
        exceeds ``rollout.env_timeout_s``, closes the env from another thread; the running program
        must die then, so that the stuck ``run`` returns and its thread is freed. Backends that
        hold more (a Docker client) call ``super().close()`` first. A run that starts after (or
        while) ``close`` runs is killed as soon as it registers: a Docker container still being
        created when ``close`` came would otherwise run to its wall clock."""
        self._run_tracker().close()
        self.abort_runs()

    # --- runs in flight -------------------------------------------------------------------------
    def _run_tracker(self) -> RunTracker:
        tracker = self.__dict__.get("_runs")
        if tracker is None:
            tracker = self.__dict__.setdefault("_runs", RunTracker())  # atomic: one wins
        return tracker

    def begin_run(self) -> threading.Event:
        """Register a run; the returned event is set when the run must be killed (``close``)."""
        return self._run_tracker().begin()

    def end_run(self, abort: threading.Event) -> None:
        self._run_tracker().end(abort)

    def runs_in_flight(self) -> int:
        return self._run_tracker().count()

    def abort_runs(self, wait_s: float = 10.0) -> int:
        """Ask every run in flight to kill its program, and wait up to ``wait_s`` for them to be
        gone. Returns how many runs were aborted."""
        return self._run_tracker().abort_all(wait_s)


class RunTracker:
    """The runs in flight of one sandbox, each with an abort event its runner polls.

    The runner (the thread in ``run``) does the killing itself as soon as it sees the event (it
    polls every 20 ms), so a kill never races with that thread's own clean-up; ``abort_all``
    waits until the runs have ended, so after ``close()`` returns no program of it is running.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._runs: set[threading.Event] = set()
        self._closed = False

    def begin(self) -> threading.Event:
        """A new run's abort event: already set once the sandbox is closed."""
        abort = threading.Event()
        with self._cond:
            self._runs.add(abort)
            if self._closed:
                abort.set()
        return abort

    def close(self) -> None:
        """From now on every run is aborted as soon as it begins."""
        with self._cond:
            self._closed = True

    def end(self, abort: threading.Event) -> None:
        with self._cond:
            self._runs.discard(abort)
            self._cond.notify_all()

    def count(self) -> int:
        with self._cond:
            return len(self._runs)

    def abort_all(self, wait_s: float) -> int:
        with self._cond:
            runs = list(self._runs)
            for abort in runs:
                abort.set()
            self._cond.wait_for(lambda: not (self._runs & set(runs)), timeout=wait_s)
        return len(runs)


def prepare_files(program: str | None, files: Mapping[str, str | bytes] | None) -> dict[str, bytes]:
    """The files of a run as bytes, with ``program`` as ``main.py``; rejects paths that escape."""
    out: dict[str, bytes] = {}
    for name, content in (files or {}).items():
        parts = name.split("/")
        if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"sandbox file name {name!r} must be a relative path without '..'")
        out[name] = content.encode() if isinstance(content, str) else bytes(content)
    if program is not None:
        out[MAIN_FILE] = program.encode()
    if not out:
        raise ValueError("sandbox run needs a program or files")
    return out


@dataclass(frozen=True)
class RunRequest:
    """One run as every backend receives it: limits, files (``main.py`` included), argv, stdin."""

    limits: Limits
    files: dict[str, bytes]
    argv: list[str]
    stdin: bytes


def prepare_run(
    program: str | None,
    files: Mapping[str, str | bytes] | None,
    command: list[str] | None,
    stdin: str | bytes,
    limits: Limits | None,
    python: str | None = None,
) -> RunRequest:
    """The arguments of :meth:`Sandbox.run` checked and defaulted, the same way for every backend:
    default limits, the files as bytes, ``python3 main.py`` when no command is given and, with
    ``python``, a leading ``python3``/``python`` replaced by that interpreter (the local backends
    must not run a python from a home directory the sandbox user cannot read)."""
    argv = list(command or ["python3", "main.py"])
    if python is not None and argv[0] in ("python3", "python"):
        argv[0] = python
    return RunRequest(limits or Limits(), prepare_files(program, files), argv, to_bytes(stdin))


def to_bytes(data: str | bytes) -> bytes:
    return data.encode() if isinstance(data, str) else bytes(data)


class CappedReader(threading.Thread):
    """Drains one pipe in the background, keeping at most ``cap`` bytes.

    Why a thread that keeps draining: a program that floods its output must not block on a full
    pipe (it would look like a hang); we keep the first ``cap`` bytes and set ``overflow`` so the
    runner can kill the program early with reason ``output_limit``.
    """

    def __init__(self, stream: IO[bytes], cap: int, overflow: threading.Event):
        super().__init__(daemon=True)
        self.stream = stream
        self.cap = cap
        self.overflow = overflow
        self.buf = bytearray()
        self.truncated = False

    def run(self) -> None:
        try:
            while True:
                chunk = (
                    self.stream.read1(65_536)
                    if hasattr(self.stream, "read1")
                    else self.stream.read(65_536)
                )
                if not chunk:
                    break
                room = self.cap - len(self.buf)
                if room > 0:
                    self.buf += chunk[:room]
                if len(chunk) > room:
                    self.truncated = True
                    self.overflow.set()
        except (OSError, ValueError):
            pass

    def text(self) -> str:
        text = self.buf.decode("utf-8", errors="replace")
        return text + "\n[... output truncated ...]" if self.truncated else text


def feed_stdin(stream: IO[bytes] | None, data: bytes) -> threading.Thread | None:
    """Write ``data`` to the child's stdin from a thread, then close it (a child that never reads
    must not block us)."""
    if stream is None:
        return None

    def _write() -> None:
        try:
            if data:
                stream.write(data)
            stream.close()
        except (OSError, ValueError):
            pass

    thread = threading.Thread(target=_write, daemon=True)
    thread.start()
    return thread
