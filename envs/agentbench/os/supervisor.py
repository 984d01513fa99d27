"""Process supervisor that runs *inside* an OS-interaction sandbox (overlay or Docker).

Why: AgentBench's agent talks to one persistent shell (so ``cd``, variables and background jobs
survive between turns) while init, start and check scripts run as independent processes of the same
system. Doing the process management inside the sandbox keeps the host side a thin pipe and makes the
overlay and Docker backends behave the same. This file uses only the standard library and Python 3.8
syntax because it runs on whatever ``python3`` the sandbox has; the host starts it with
``python3 -c <this source>``.

Protocol: one JSON object per line on stdin, one JSON reply per line on stdout.
  {"op": "shell", "cmd": str, "timeout": s}  -> run in the persistent shell
  {"op": "exec", "argv": [...], "timeout": s} -> run an independent process (cwd /, clean env)
  {"op": "ping"}
Replies carry ``output`` (base64 of stdout+stderr), ``exit`` and ``timed_out``.
"""

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "USER": "root",
    "LOGNAME": "root",
    "SHELL": "/bin/bash",
    "LANG": "C.UTF-8",
    "TERM": "dumb",
}
MAX_CAPTURE = 1 << 20
#: Per-process limits (address space, file size) so one command cannot exhaust the host.
LIMITS = {"RLIMIT_AS": 8 << 30, "RLIMIT_FSIZE": 2 << 30}


def _limit():
    import resource

    for name, value in LIMITS.items():
        try:
            resource.setrlimit(getattr(resource, name), (value, value))
        except (ValueError, OSError, AttributeError):
            pass


def _children_map():
    """pid -> parent pid for every process visible in /proc."""
    parents = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().decode("utf-8", "replace")
            parents[int(name)] = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return parents


def _descendants(root):
    parents = _children_map()
    out, frontier = set(), {root}
    while frontier:
        nxt = {pid for pid, ppid in parents.items() if ppid in frontier and pid not in out}
        out |= nxt
        frontier = nxt
    return out


def _kill(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


class Shell:
    """A persistent ``bash --login`` whose output is read up to a per-command end marker."""

    def __init__(self):
        self.proc = subprocess.Popen(
            ["bash", "--login"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd="/",
            env=ENV,
            start_new_session=True,
            preexec_fn=_limit,
        )
        self.buf = bytearray()
        self.cond = threading.Condition()
        self.eof = False
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        while True:
            chunk = self.proc.stdout.read1(65536)
            with self.cond:
                if not chunk:
                    self.eof = True
                    self.cond.notify_all()
                    return
                if len(self.buf) < MAX_CAPTURE:
                    self.buf += chunk
                self.cond.notify_all()

    def alive(self):
        return self.proc.poll() is None and not self.eof

    def run(self, cmd, timeout):
        marker = f"__AF_DONE_{uuid.uuid4().hex}__".encode()
        encoded = base64.b64encode(cmd.encode("utf-8")).decode()
        script = (
            f"eval \"$(printf %s '{encoded}' | base64 -d)\" < /dev/null\n"
            f"printf '\\n{marker.decode()}:%s\\n' \"$?\"\n"
        )
        before = _descendants(self.proc.pid)
        with self.cond:
            self.buf.clear()
        self.proc.stdin.write(script.encode())
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        timed_out = False
        done = self._wait(marker, deadline)
        if done is None and not self.eof:
            # Kill what this command started (jobs from earlier commands, e.g. the task's start
            # script, survive), again and again for a moment, so a list or loop cannot go on.
            timed_out = True
            grace = time.monotonic() + 3
            while done is None and time.monotonic() < grace and not self.eof:
                _kill(_descendants(self.proc.pid) - before)
                done = self._wait(marker, time.monotonic() + 0.2)
        with self.cond:
            data = bytes(self.buf)
        if done is not None:
            idx, code = done
            return {"output": data[:idx], "exit": code, "timed_out": timed_out, "restarted": False}
        # The shell itself is stuck (a builtin loop) or gone (``exit``): replace it, keeping the
        # background jobs of earlier commands alive.
        _kill((_descendants(self.proc.pid) - before) | {self.proc.pid})
        self.eof = True
        return {"output": data, "exit": -1, "timed_out": timed_out, "restarted": True}

    def _wait(self, marker, deadline):
        needle = b"\n" + marker + b":"
        with self.cond:
            while True:
                idx = self.buf.find(needle)
                if idx >= 0:
                    end = self.buf.find(b"\n", idx + len(needle))
                    if end >= 0:
                        raw = bytes(self.buf[idx + len(needle) : end])
                        try:
                            code = int(raw)
                        except ValueError:
                            code = -1
                        return idx, code
                if self.eof:
                    return None
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(left)

    def close(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            self.proc.kill()
        except OSError:
            pass


def run_independent(argv, timeout):
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd="/",
        env=ENV,
        start_new_session=True,
        preexec_fn=_limit,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        return {"output": out[:MAX_CAPTURE], "exit": proc.returncode, "timed_out": False}
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        out, _ = proc.communicate()
        return {"output": out[:MAX_CAPTURE], "exit": -1, "timed_out": True}


def main():
    shell = None
    for line in sys.stdin:
        req = json.loads(line)
        op = req.get("op")
        if op == "shell":
            if shell is None or not shell.alive():
                shell = Shell()
            reply = shell.run(req["cmd"], float(req.get("timeout", 30)))
        elif op == "exec":
            reply = run_independent(req["argv"], float(req.get("timeout", 30)))
        elif op == "ping":
            reply = {"output": b"", "exit": 0, "timed_out": False}
        else:
            reply = {"output": f"unknown op {op!r}".encode(), "exit": -1, "timed_out": False}
        reply["output"] = base64.b64encode(reply["output"]).decode()
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    if shell is not None:
        shell.close()


if __name__ == "__main__":
    main()
