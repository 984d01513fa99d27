"""Running a command as a local child process with limits: shared by the bwrap and process backends.

The child gets rlimits (address space, CPU seconds, file size, open files, no core dumps), its own
session (so the whole group can be killed), a pids cgroup when the host allows one, and optionally
a drop to an unprivileged uid. The wall clock is enforced here, from the parent.
"""

from __future__ import annotations

import math
import os
import resource
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import psutil
from astraflow.envs.sandbox.base import CappedReader, Limits, RunResult, feed_stdin
from astraflow.envs.sandbox.cgroup import PidsCgroup

MIB = 1024 * 1024
NOBODY = (65534, 65534)


def make_preexec(
    limits: Limits, cgroup: PidsCgroup | None, user: tuple[int, int] | None, rlimit_as: bool = True
) -> Callable[[], None]:
    """The function run in the child between fork and exec (must not start threads)."""
    procs_file = cgroup.attach_pid_file() if cgroup else None
    cpu = math.ceil(limits.wall_time_s) + 1
    # RLIMIT_NPROC counts every process of the uid, not just ours: allow what already runs.
    nproc = limits.pids + (0 if cgroup else _processes_of(user[0] if user else os.getuid()))

    def _preexec() -> None:
        if procs_file:
            with open(procs_file, "w") as fh:
                fh.write(str(os.getpid()))
        if rlimit_as:
            mem = limits.memory_mb * MIB
            resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        size = limits.file_size_mb * MIB
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if user is not None:
            os.setgroups([])
            os.setgid(user[1])
            os.setuid(user[0])
        if procs_file is None and (user is not None or os.getuid() != 0):
            # Without a cgroup, NPROC (per real uid) is the only fork-bomb brake left.
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))

    return _preexec


def _processes_of(uid: int) -> int:
    count = 0
    for proc in psutil.process_iter(["uids"]):
        try:
            count += proc.info["uids"].real == uid
        except (psutil.Error, AttributeError):
            continue
    return count


def _kill_tree(proc: subprocess.Popen, known: set[int]) -> None:
    """Kill the child's process group and every descendant we have seen."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        known.update(c.pid for c in psutil.Process(proc.pid).children(recursive=True))
    except psutil.Error:
        pass
    for pid in known:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return str(num)


def run_local(
    argv: list[str],
    *,
    cwd: str,
    env: dict[str, str],
    stdin: bytes,
    limits: Limits,
    backend: str,
    user: tuple[int, int] | None = None,
    rlimit_as: bool = True,
    signal_exit_offset: bool = False,
    use_cgroup: bool = True,
    abort: threading.Event | None = None,
) -> RunResult:
    """Run ``argv`` to completion or to a limit; always leaves nothing running.

    ``signal_exit_offset``: the wrapper (bwrap) reports a child killed by signal N as 128+N.
    ``use_cgroup=False`` skips the pids cgroup even where one could be made (rlimits only).
    ``abort``: set from another thread (the sandbox's ``close``) to kill the run at once
    (``killed_reason="closed"``).
    """
    cgroup = PidsCgroup.create(limits.pids) if use_cgroup else None
    overflow = threading.Event()
    start = time.monotonic()
    seen: set[int] = set()
    timed_out = False
    reason: str | None = None
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
            preexec_fn=make_preexec(limits, cgroup, user, rlimit_as),
        )
    except BaseException:
        if cgroup:
            cgroup.destroy()
        raise
    out = CappedReader(proc.stdout, limits.output_bytes, overflow)
    err = CappedReader(proc.stderr, limits.output_bytes, overflow)
    out.start()
    err.start()
    feed_stdin(proc.stdin, stdin)
    deadline = start + limits.wall_time_s
    ticks = 0
    try:
        while True:
            try:
                proc.wait(timeout=0.02)
                break
            except subprocess.TimeoutExpired:
                pass
            if overflow.is_set():
                reason = "output_limit"
                break
            if abort is not None and abort.is_set():
                reason = "closed"
                break
            if time.monotonic() >= deadline:
                timed_out, reason = True, "timeout"
                break
            ticks += 1
            # Without a cgroup, remember descendants (a scan of /proc, so only every ~0.2 s) so
            # that ones which leave our process group can still be killed.
            if cgroup is None and ticks % 10 == 0 and len(seen) < 4096:
                try:
                    seen.update(c.pid for c in psutil.Process(proc.pid).children(recursive=True))
                except psutil.Error:
                    pass
    finally:
        _kill_tree(proc, seen)
        if cgroup:
            cgroup.destroy()
        proc.wait()
        duration = time.monotonic() - start
        out.join(2.0)
        err.join(2.0)
        for stream in (proc.stdout, proc.stderr):
            try:
                stream.close()
            except OSError:
                pass
    code = proc.returncode
    stderr_text = err.text()
    if reason is None and code is not None:
        if code < 0:
            reason = f"signal:{_signal_name(-code)}"
        elif signal_exit_offset and code > 128 and code - 128 in (9, 24, 25, 6, 11):
            reason = f"signal:{_signal_name(code - 128)}"
    if reason == "signal:SIGXCPU":
        timed_out = True
    oom = "MemoryError" in stderr_text[-4000:]
    return RunResult(
        exit_code=code,
        stdout=out.text(),
        stderr=stderr_text,
        timed_out=timed_out,
        oom=oom,
        killed_reason=reason,
        duration_s=duration,
        backend=backend,
        stdout_truncated=out.truncated,
        stderr_truncated=err.truncated,
        details={"cgroup": cgroup is not None, "uid": user[0] if user else os.getuid()},
    )


def populate_workdir(
    workdir: str, payload: Mapping[str, bytes], owner: tuple[int, int] | None
) -> None:
    """Write a run's files into its work dir and hand them to the sandbox user, so code that runs
    as ``nobody`` can read and rewrite its own files (and nothing else of the host's)."""
    for name, content in payload.items():
        path = Path(workdir, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    if owner:
        for root, dirs, names in os.walk(workdir):
            for entry in [root, *(os.path.join(root, n) for n in dirs + names)]:
                os.chown(entry, *owner)
