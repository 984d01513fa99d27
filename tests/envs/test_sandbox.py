"""The sandbox interface on every available backend, and how a backend is chosen."""

from __future__ import annotations

import logging

import pytest
from astraflow.envs.sandbox import ENV_VAR, Limits, SandboxError, make_backend, select_backend
from astraflow.envs.sandbox.base import prepare_files
from sandbox_helpers import backend_or_skip

BACKENDS = ["docker", "bwrap", "process"]


@pytest.fixture(scope="module", params=BACKENDS)
def box(request):
    backend = backend_or_skip(request.param)
    yield backend
    backend.close()


def test_program_stdin_files_and_exit_code(box):
    program = (
        "import sys, json\n"
        "data = json.load(open('data/in.json'))\n"
        "line = sys.stdin.read()\n"
        "print(data['x'] + int(line))\n"
        "print('to stderr', file=sys.stderr)\n"
        "sys.exit(3)\n"
    )
    result = box.run(program, files={"data/in.json": '{"x": 40}'}, stdin="2")
    assert result.backend == box.name
    assert result.stdout.strip() == "42"
    assert "to stderr" in result.stderr
    assert result.exit_code == 3
    assert result.killed_reason is None and not result.timed_out and not result.ok


def test_command_and_clean_exit(box):
    result = box.run(files={"hello.py": "print('hi')"}, command=["python3", "hello.py"])
    assert result.ok and result.stdout == "hi\n"
    assert result.summary()["backend"] == box.name


def test_each_run_gets_a_fresh_work_dir(box):
    box.run("open('left.txt', 'w').write('x')")
    result = box.run("import os; print(sorted(os.listdir('.')))")
    assert "left.txt" not in result.stdout


def test_runs_as_unprivileged_user(box):
    result = box.run("import os; print(os.getuid())")
    assert result.stdout.strip() != "0"


def test_bad_file_names_are_rejected():
    with pytest.raises(ValueError, match="relative path"):
        prepare_files(None, {"../escape.py": "x"})
    with pytest.raises(ValueError, match="relative path"):
        prepare_files(None, {"/etc/passwd": "x"})
    with pytest.raises(ValueError, match="needs a program"):
        prepare_files(None, None)


def test_limits_are_validated():
    with pytest.raises(ValueError, match="wall_time_s"):
        Limits(wall_time_s=0)


def test_unknown_backend_names_what_is_expected(monkeypatch):
    with pytest.raises(ValueError, match="expected one of auto, docker, bwrap, process"):
        select_backend("firecracker")
    monkeypatch.setenv(ENV_VAR, "nope")
    with pytest.raises(ValueError, match=r"\$ASTRAFLOW_SANDBOX='nope'"):
        select_backend()


def test_env_var_and_explicit_choice(monkeypatch, caplog):
    monkeypatch.setenv(ENV_VAR, "process")
    with caplog.at_level(logging.WARNING, logger="astraflow.sandbox"):
        box = select_backend()
    assert box.name == "process" and not box.isolated
    assert "NO SANDBOX ISOLATION" in caplog.text
    # an explicit argument wins over the environment variable
    try:
        assert select_backend("bwrap").name == "bwrap"
    except SandboxError as exc:
        pytest.skip(f"bwrap unavailable: {exc}")


def test_auto_prefers_the_strongest_available(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    box = select_backend("auto")
    available = []
    for name in BACKENDS:
        try:
            make_backend(name).close()
            available.append(name)
        except SandboxError:
            pass
    assert box.name == available[0]


def test_explicit_docker_without_engine_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(SandboxError, match="no Docker engine answers"):
        select_backend("docker")


def test_cli_lists_backends():
    from astraflow.cli.sandbox import app
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["list"])
    assert result.exit_code == 0, result.output
    assert "process" in result.output and "NONE (rlimits only)" in result.output
    assert "auto choice:" in result.output


@pytest.mark.parametrize("name", BACKENDS)
def test_close_from_another_thread_kills_the_running_program(name):
    """A rollout node closes an env whose step ran past rollout.env_timeout_s from another
    thread: the program must die at once (not at its wall clock) and ``run`` must return.

    The close comes only once the program runs (its process is seen on this host: a container's
    processes are host processes too), so on docker this is the kill of a running container, not
    the abort of one still being created (that path is the next two tests')."""
    import secrets
    import threading
    import time

    import psutil

    box = backend_or_skip(name)
    token = secrets.token_hex(6)
    done: dict = {}

    def run() -> None:
        done["result"] = box.run(
            files={f"sleeper_{token}.py": "import time\ntime.sleep(60)\nprint('finished')"},
            command=["python3", f"sleeper_{token}.py"],
            limits=Limits(wall_time_s=60),
        )

    def running() -> bool:
        for proc in psutil.process_iter(["cmdline"]):
            try:
                if any(token in part for part in proc.info["cmdline"] or []):
                    return True
            except psutil.Error:
                continue
        return False

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    deadline = time.monotonic() + 30
    while not running() and runner.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert running(), "the program never started"
    t0 = time.monotonic()
    box.close()  # returns once the run has ended
    runner.join(15)
    assert not runner.is_alive(), "run() did not return after close()"
    result = done["result"]
    assert result.killed_reason == "closed", result.summary()
    assert "finished" not in result.stdout
    assert time.monotonic() - t0 < 15
    assert not running(), "the program outlived close()"


@pytest.mark.parametrize("name", BACKENDS)
def test_a_run_that_begins_after_close_is_killed_at_once(name):
    """A close() that lands while a run is still being set up (a Docker container being created)
    finds no program to kill yet; the run must still end at once instead of at its wall clock."""
    import time

    box = backend_or_skip(name)
    box.close()
    t0 = time.monotonic()
    result = box.run(
        "import time\ntime.sleep(30)\nprint('finished')", limits=Limits(wall_time_s=30)
    )
    assert result.killed_reason == "closed", result.summary()
    assert "finished" not in result.stdout
    assert time.monotonic() - t0 < 15


def test_docker_close_while_the_container_is_created_leaves_nothing():
    """The docker kill path end to end: close() from another thread right after run() began
    (typically while the engine creates the container); run returns "closed", and no container
    of the sandbox is left on the engine."""
    import threading
    import time

    from astraflow.envs.sandbox.docker import LABEL

    box = backend_or_skip("docker")
    client = box.client
    done: dict = {}

    def run() -> None:
        done["result"] = box.run("import time\ntime.sleep(60)", limits=Limits(wall_time_s=60))

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    while box.runs_in_flight() == 0 and runner.is_alive():
        time.sleep(0.001)
    box.close()
    runner.join(30)
    assert not runner.is_alive(), "run() did not return after close()"
    assert done["result"].killed_reason == "closed", done["result"].summary()
    left = client.containers.list(all=True, filters={"label": LABEL})
    assert not left, f"containers left behind: {[c.short_id for c in left]}"
