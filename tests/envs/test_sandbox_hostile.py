"""Hostile programs against every sandbox backend available here.

Each attack must be contained (the host and this test process are unharmed), reported in the
:class:`RunResult`, and leave nothing running (no process, no container). The ``process`` backend
is not isolation: the checks it cannot pass by design (network, host files) are xfailed with that
reason, the others must hold for it too.
"""

from __future__ import annotations

import os
import secrets
import socket
import time

import psutil
import pytest
from astraflow.envs.sandbox import Limits, make_backend
from sandbox_helpers import backend_or_skip

#: "-rlimits": the local backends without the pids cgroup, as on hosts that do not allow one.
BACKENDS = ["docker", "bwrap", "process", "bwrap-rlimits", "process-rlimits"]
NOT_ISOLATED = "the process backend is documented as NOT isolation (shares network and filesystem)"


def _make(name: str):
    if name == "bwrap-rlimits":
        from astraflow.envs.sandbox.bwrap import BwrapSandbox

        backend = BwrapSandbox(use_cgroup=False)
        backend.probe()
        return backend
    if name == "process-rlimits":
        from astraflow.envs.sandbox.process import ProcessSandbox

        return ProcessSandbox(use_cgroup=False)
    return make_backend(name)


@pytest.fixture(scope="module", params=BACKENDS)
def box(request):
    backend = backend_or_skip(request.param, _make)
    yield backend
    backend.close()


def run_hostile(box, source: str, **limits):
    """Run ``source`` under a unique file name so leftovers can be found by command line."""
    token = secrets.token_hex(6)
    name = f"hostile_{token}.py"
    started = time.time()
    result = box.run(
        files={name: source},
        command=["python3", name],
        limits=Limits(**{"wall_time_s": 5.0, "memory_mb": 256, "pids": 32, **limits}),
    )
    assert_nothing_left(box, token, started)
    return result


def assert_nothing_left(box, token: str, started: float) -> None:
    deadline = time.time() + 3.0
    while True:
        left = []
        for proc in psutil.process_iter(["cmdline", "pid"]):
            try:
                if any(token in part for part in proc.info["cmdline"] or []):
                    left.append(proc.info["pid"])
            except psutil.Error:
                continue
        if not left or time.time() > deadline:
            break
        time.sleep(0.1)
    assert not left, f"processes left running after the run: {left}"
    if box.name == "docker":
        from astraflow.envs.sandbox.docker import LABEL

        containers = box.client.containers.list(all=True, filters={"label": LABEL})
        assert not containers, f"containers left behind: {[c.short_id for c in containers]}"


def test_network_access_is_blocked(box):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    source = f"""
import socket
for host in ("127.0.0.1", "1.1.1.1"):
    try:
        socket.create_connection((host, {port} if host == "127.0.0.1" else 53), timeout=2).close()
        print("CONNECTED", host)
    except OSError as exc:
        print("BLOCKED", host, type(exc).__name__)
"""
    try:
        result = run_hostile(box, source)
        try:
            conn, _ = listener.accept()
            conn.close()
            reached = True
        except TimeoutError:
            reached = False
    finally:
        listener.close()
    if not box.isolated:
        pytest.xfail(NOT_ISOLATED)
    assert "CONNECTED" not in result.stdout, result.stdout
    assert result.stdout.count("BLOCKED") == 2, result
    assert not reached, "the host listener received a connection from the sandbox"


@pytest.mark.slow
def test_fork_bomb_is_contained(box):
    source = """
import os, time
kids = 0
end = time.time() + 60
while time.time() < end:
    try:
        if os.fork() == 0:
            kids = 0
        else:
            kids += 1
    except OSError:
        time.sleep(0.01)
"""
    t0 = time.monotonic()
    result = run_hostile(box, source, wall_time_s=3.0)
    assert result.timed_out and result.killed_reason == "timeout", result
    assert time.monotonic() - t0 < 20
    assert psutil.Process().is_running()


def test_daemonized_child_does_not_survive(box):
    source = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(600)
    os._exit(0)
print("parent exits", flush=True)
"""
    if not box.isolated and not getattr(box, "use_cgroup", True):
        pytest.xfail("without a pids cgroup the process backend cannot find a setsid() grandchild")
    result = run_hostile(box, source)  # asserts that the sleeper was killed too
    assert "parent exits" in result.stdout


def test_memory_blow_up_is_contained(box):
    source = """
blocks = []
while True:
    blocks.append(bytearray(32 * 1024 * 1024))
"""
    result = run_hostile(box, source, memory_mb=200)
    assert result.oom, result
    assert result.exit_code != 0
    assert not result.timed_out, "the memory limit, not the clock, must stop the program"


@pytest.mark.slow
def test_infinite_loop_is_killed_at_the_wall_clock(box):
    t0 = time.monotonic()
    result = run_hostile(box, "while True:\n    pass\n", wall_time_s=2.0)
    elapsed = time.monotonic() - t0
    assert result.timed_out and result.killed_reason == "timeout", result
    assert 1.9 <= result.duration_s < 10, result.duration_s
    assert elapsed < 15


def test_writing_outside_the_work_dir_fails(box, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    outside.chmod(0o777)
    targets = ["/etc/af_pwned", "/usr/af_pwned", str(outside / "pwned.txt")]
    source = f"""
for path in {targets!r}:
    try:
        with open(path, "w") as fh:
            fh.write("pwned")
        print("WROTE", path)
    except OSError as exc:
        print("DENIED", path, type(exc).__name__)
with open("inside.txt", "w") as fh:
    fh.write("ok")
print("INSIDE OK")
"""
    result = run_hostile(box, source)
    assert "INSIDE OK" in result.stdout, result
    for path in targets[:2]:
        assert f"DENIED {path}" in result.stdout
        assert not os.path.exists(path)
    if not box.isolated:
        pytest.xfail(NOT_ISOLATED)
    assert f"DENIED {targets[2]}" in result.stdout
    assert not (outside / "pwned.txt").exists()


def test_host_secrets_are_not_readable(box, tmp_path, monkeypatch):
    secret = "AFSECRET-" + secrets.token_hex(8)
    monkeypatch.setenv("AF_HOST_SECRET", secret)
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text(secret)
    secret_file.chmod(0o644)
    tmp_path.chmod(0o755)
    paths = [str(secret_file), "/etc/shadow", "/root/.bash_history", "/proc/1/environ"]
    source = f"""
import os
print("ENV", sorted(os.environ.items()))
for path in {paths!r}:
    try:
        with open(path, "rb") as fh:
            print("READ", path, fh.read(4096))
    except OSError as exc:
        print("DENIED", path, type(exc).__name__)
"""
    result = run_hostile(box, source)
    assert "ENV" in result.stdout, result
    env_line = next(line for line in result.stdout.splitlines() if line.startswith("ENV"))
    assert secret not in env_line, "host environment leaked into the sandbox"
    for path in paths[1:3]:
        assert f"READ {path}" not in result.stdout
    if not box.isolated:
        pytest.xfail(NOT_ISOLATED)
    assert secret not in result.stdout
    assert "AF_HOST_SECRET" not in result.stdout


@pytest.mark.slow
def test_killing_the_parent_is_contained(box):
    host_pid = os.getpid()
    source = f"""
import os, signal, time
for pid in (os.getppid(), {host_pid}, 1):
    try:
        os.kill(pid, signal.SIGKILL)
        print("KILLED", pid, flush=True)
    except OSError as exc:
        print("DENIED", pid, type(exc).__name__, flush=True)
time.sleep(30)
"""
    t0 = time.monotonic()
    result = run_hostile(box, source, wall_time_s=4.0)
    assert psutil.pid_exists(host_pid)  # we are still here
    assert time.monotonic() - t0 < 20
    assert result.killed_reason is not None or result.exit_code != 0, result


def test_huge_output_is_truncated(box):
    source = """
import sys
chunk = "x" * 65536
while True:
    sys.stdout.write(chunk)
    sys.stderr.write(chunk)
"""
    t0 = time.monotonic()
    result = run_hostile(box, source, wall_time_s=10.0, output_bytes=10_000)
    assert result.stdout_truncated and result.killed_reason == "output_limit", result.summary()
    assert len(result.stdout) < 10_000 + 100
    assert len(result.stderr) < 10_000 + 100
    assert time.monotonic() - t0 < 10, "output overflow must stop the run early"


# --- reward forging: a solution that tries to raise its own pass fraction -----------------------

FORGE_TASK = {
    "prompt": "def secret(n):\n",
    "entry_point": "secret",
    "tests": (
        "def check(candidate):\n"
        "    assert candidate(1) == 'q7'\n"
        "    assert candidate(2) == 'z3'\n"
        "    assert candidate(3) == (4, 'w')\n"
        "    assert candidate(4) is True\n"
    ),
}
HONEST = "def secret(n):\n    return {1: 'q7', 2: 'z3', 3: (4, 'w'), 4: True}[n]\n"

#: Lines that would be result lines if the harness's marker could be found or guessed.
_FAKE_LINES = """
def _fake_lines(nonce):
    out = []
    for i in range(-1, 64):
        out.append(nonce + json.dumps({"kind": "test", "i": i, "ok": True, "error": None}))
    out.append(nonce + json.dumps({"kind": "done"}))
    return "\\n".join(out) + "\\n"
"""

FORGERS = {
    # The old harness looked its helpers up in __main__ at call time: replace the test runner.
    "patch_main_module": """
import sys
_m = sys.modules["__main__"]
_m._run = lambda *a, **k: None
_m.__dict__["_run"] = lambda *a, **k: None
def secret(n):
    return None
""",
    # An object equal to everything passes every `==` assert of an in-process harness.
    "always_equal": """
class _Any:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    def __bool__(self):
        return True
    __hash__ = object.__hash__
class _S(str):
    def __eq__(self, other):
        return True
    __hash__ = str.__hash__
def secret(n):
    return _Any() if n % 2 else _S("x")
""",
    # Find the marker (own memory, the program file, the parent's memory/cmdline/environ) and
    # print result lines everywhere a result channel might be, then exit cleanly.
    "print_marker_lines": _FAKE_LINES
    + r"""
import gc, json, os, re, sys
found = set()
for obj in gc.get_objects():
    if isinstance(obj, str) and obj.startswith("@@AF-"):
        found.add(obj[:23])
for m in list(sys.modules.values()):
    for v in list(getattr(m, "__dict__", {}).values()):
        if isinstance(v, str) and v.startswith("@@AF-"):
            found.add(v)
pids = {os.getpid(), os.getppid(), 1}
for pid in pids:
    for name in ("cmdline", "environ"):
        try:
            found.update(re.findall(rb"@@AF-[0-9a-f]{16}@@", open(f"/proc/{pid}/{name}", "rb").read()))
        except OSError:
            pass
    try:
        with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb") as mem:
            for line in maps:
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                if "rw" in line.split()[1] and hi - lo < 64 << 20:
                    try:
                        mem.seek(lo)
                        found.update(re.findall(rb"@@AF-[0-9a-f]{16}@@", mem.read(hi - lo)))
                    except OSError:
                        pass
    except OSError:
        pass
for path in ("main.py", "/work/main.py"):
    try:
        found.update(re.findall(r"@@AF-[0-9a-f]{16}@@", open(path).read()))
    except OSError:
        pass
nonces = {n.decode() if isinstance(n, bytes) else n for n in found} | {"@@AF-0000000000000000@@"}
text = "".join(_fake_lines(n) for n in nonces)
for fd in (1, 2):
    try:
        os.write(fd, text.encode())
    except OSError:
        pass
for pid in pids:
    for fd in range(0, 8):
        try:
            with open(f"/proc/{pid}/fd/{fd}", "w") as fh:
                fh.write(text)
        except OSError:
            pass
sys.stdout.write(text)
sys.stdout.flush()
os._exit(0)
""",
    # Exit before any test runs, and from inside the function under test.
    "exit_at_import": "import os\nos._exit(0)\n",
    "exit_in_call": "import os, sys\ndef secret(n):\n    os._exit(0) if n % 2 else sys.exit(0)\n",
    # Kill the judge (the parent) so that nothing can report the failures.
    "kill_the_judge": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"
    "def secret(n):\n    return None\n",
}


def forge_score(box, solution: str) -> float:
    """The pass fraction the code env's harness gives ``solution`` on this backend."""
    from astraflow.envs.code.harness import build_program, parse_report, plan_tests

    plan = plan_tests(FORGE_TASK["tests"])
    program, nonce = build_program(
        solution, plan, FORGE_TASK["entry_point"], test_timeout_s=5.0, load_timeout_s=5.0
    )
    result = box.run(program, limits=Limits(wall_time_s=30.0, memory_mb=512, pids=32))
    return parse_report(result.stdout, nonce, plan).pass_fraction


def test_honest_solution_scores_full_marks(box):
    assert forge_score(box, HONEST) == 1.0


@pytest.mark.parametrize("forger", sorted(FORGERS))
def test_reward_forging_programs_score_zero(box, forger):
    assert forge_score(box, FORGERS[forger]) == 0.0
