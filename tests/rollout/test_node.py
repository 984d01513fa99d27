"""Rollout node reliability: elastic joins and SIGKILL, SIGTERM drain/release, bad tasks, engine
crashes, startup errors and push retries.

Real processes throughout: ``astraflow serve dataflow`` and ``astraflow serve rollout`` (built-in
tiny model, transformers engine, CPU) talking HTTP on loopback. The runs are finite (one pass over
a fixed number of tasks with a frozen policy), so "every task exactly once" is checked on the
service's SQLite store: one winning lease per task that delivered the whole group, no other
lease's episodes counted. SIGSTOP is used only to hold a node still at a moment when it holds
leases, so that the signal or kill that follows hits in-flight work deterministically.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from astraflow.dataflow.storage import history
from astraflow.protocol.client import AuthError, SyncDataflowClient
from astraflow.recipe import load_recipe

sys.path.insert(0, str(Path(__file__).resolve().parent))

from node_helpers import (  # noqa: E402
    GROUP_SIZE,
    REPO,
    TOKEN,
    Dataflow,
    DroppingProxy,
    arith_recipe,
    assert_every_task_once,
    freeze_holding_leases,
    node_id,
    recipe_toml,
    start_node,
    wait_for,
)

# every test runs a dataflow service and rollout node processes: slow tier
pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


def _active_leases(df: Dataflow, nid: str) -> list[tuple[str, str]]:
    return [
        (lease.id, lease.task_id)
        for lease in df.read(history.leases)
        if lease.node_id == nid and lease.state == "active"
    ]


def _lease_states(df: Dataflow, ids: list[str]) -> dict[str, tuple[str, str | None]]:
    """Lease id -> (its state, the winning lease of its task)."""
    winner = {t.id: t.winner for t in df.read(history.tasks)}
    return {
        lease.id: (lease.state, winner[lease.task_id])
        for lease in df.read(history.leases)
        if lease.id in ids
    }


def _finish(df: Dataflow, node, timeout: float = 150) -> None:
    wait_for("the run to finish", lambda: df.status()["done"], timeout=timeout, every=0.25)
    assert node.wait(60) == 0, node.output()[-3000:]


def test_elastic_join_then_sigkill_every_task_once(tmp_path, procs):
    n = 60
    df = Dataflow(tmp_path / "df", arith_recipe(tmp_path / "runs", n))
    procs.append(df)
    a = start_node(tmp_path, df.url, "A")
    procs.append(a)
    wait_for("node A to push", lambda: df.status()["tasks_done"] >= 3)
    # Hold A still while B boots (model load takes seconds), so B joins a run that is still going.
    a.signal(signal.SIGSTOP)
    b = start_node(tmp_path, df.url, "B")
    procs.append(b)
    wait_for("node B to register", lambda: df.node("B"))
    a.signal(signal.SIGCONT)
    wait_for("both nodes to push", lambda: df.node("B")["episodes"] > 0, every=0.05)
    freeze_holding_leases(df, a, "A")
    a_id, b_id = node_id(df, "A"), node_id(df, "B")
    held = _active_leases(df, a_id)
    a.signal(signal.SIGKILL)
    assert a.wait(10) == -signal.SIGKILL
    assert held, "A held no lease when it was killed"
    assert not df.status()["done"], "the run ended before A was killed; raise n"

    _finish(df, b)
    winners = assert_every_task_once(df, n)
    states = _lease_states(df, [lid for lid, _ in held])
    for lid, task_id in held:
        # expired, then marked superseded when B's lease completed the task
        assert states[lid][0] in ("expired", "superseded"), (lid, states[lid])
        assert winners[task_id] == b_id, f"task {task_id} of killed node A not redone by B"
    nodes = {nd["name"]: nd for nd in df.status()["nodes"]}
    assert nodes["B"]["state"] == "left"  # B deregistered at the end of the run
    assert nodes["A"]["state"] != "left"  # A never said goodbye
    assert set(winners.values()) == {a_id, b_id}  # both nodes did part of the run


def test_sigterm_finishes_or_releases_in_flight_and_deregisters(tmp_path, procs):
    n = 40
    # long leases: nothing here may expire, everything must be finished or released
    df = Dataflow(tmp_path / "df", recipe_toml(
        tmp_path / "runs", f'{{ name = "arith", split = "train", limit = {n} }}',
        lease_timeout_s=60.0))  # fmt: skip
    procs.append(df)
    # R releases at once on SIGTERM; F finishes its in-flight groups first (the default). R's
    # engine answers after 0.5 s, so a group it holds is still generating when the signal lands
    # (the tiny model alone finishes a group in milliseconds: its push was usually under way).
    # R starts (and is frozen holding leases) before F exists: F alone would finish all n tasks
    # in about a second, before a loaded machine has even started R.
    r = start_node(tmp_path, df.url, "R", "--drain-timeout", "0", "--concurrency", "4",
                   runner=[sys.executable, str(REPO / "tests/rollout/slow_node.py")])  # fmt: skip
    procs.append(r)
    frozen = set()

    def frozen_holding(*named):
        for name, proc in named:
            node = df.node(name)
            if name not in frozen and node and node["active_leases"]:
                freeze_holding_leases(df, proc, name)
                frozen.add(name)
        return all(name in frozen for name, _ in named)

    wait_for("R to hold leases", lambda: frozen_holding(("R", r)), every=0.05)
    f = start_node(tmp_path, df.url, "F")
    procs.append(f)
    wait_for("F to hold leases", lambda: frozen_holding(("F", f)), every=0.05)
    r_id, f_id = node_id(df, "R"), node_id(df, "F")
    r_held, f_held = _active_leases(df, r_id), _active_leases(df, f_id)
    for proc in (r, f):
        proc.signal(signal.SIGTERM)
        proc.signal(signal.SIGCONT)
    assert r.wait(60) == 0, r.output()[-3000:]
    assert f.wait(90) == 0, f.output()[-3000:]
    nodes = {nd["name"]: nd for nd in df.status()["nodes"]}
    assert nodes["R"]["state"] == nodes["F"]["state"] == "left"
    assert "deregistered" in r.output() and "deregistered" in f.output()

    r_states = _lease_states(df, [lid for lid, _ in r_held])
    assert any(st == "released" for st, _ in r_states.values()), r_states
    for lid, (st, winner) in r_states.items():  # released, or its push was already under way
        assert st == "released" or winner == lid, (lid, st)
    f_states = _lease_states(df, [lid for lid, _ in f_held])
    for lid, (st, winner) in f_states.items():  # F finished every group it held
        assert winner == lid, (lid, st, winner)
    assert not [x for x in df.read(history.leases) if x.state in ("expired", "superseded")]
    assert not df.status()["done"]

    b = start_node(tmp_path, df.url, "B")
    procs.append(b)
    _finish(df, b)
    winners = assert_every_task_once(df, n)
    b_id = node_id(df, "B")
    for lid, task_id in r_held:
        if r_states[lid][0] == "released":
            assert winners[task_id] == b_id  # released tasks were redone


def test_env_exception_fails_only_that_episode(tmp_path, procs):
    rows = [{"question": f"{i}+1", "answer": str(i + 1)} for i in range(6)]
    for bad in (1, 4):
        rows[bad]["answer"] = ""  # the math env refuses an empty answer at reset
    data = tmp_path / "problems.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sets = f'{{ name = "math_file", split = "train", kwargs = {{ path = "{data}" }} }}'
    df = Dataflow(tmp_path / "df", recipe_toml(tmp_path / "runs", sets))
    procs.append(df)
    a = start_node(tmp_path, df.url, "A")
    procs.append(a)
    _finish(df, a)
    assert_every_task_once(df, len(rows))
    per_task: dict[str, list] = {}
    for ep in df.read(history.episodes):
        per_task.setdefault(ep.task_id, []).append((ep.finish_reason, ep.error))
    failed = [t for t, eps in per_task.items() if all(r == "error" for r, _ in eps)]
    clean = [t for t, eps in per_task.items() if all(e is None for _, e in eps)]
    assert len(failed) == 2 and len(clean) == 4, per_task
    for task_id in failed:
        for _, error in per_task[task_id]:
            assert "TaskError" in error and "'answer'" in error and "empty" in error, error
    assert "episode of" in a.output()  # logged as a failed episode, not a node failure


@pytest.mark.timeout(900)
def test_engine_crash_fails_node_and_leases_expire(tmp_path, procs):
    """Every wait here is on an event (a push, a lease held, the node's exit, the run done) with a
    generous bound, never on a duration: a loaded machine only makes it slower. The lease timeout
    is long enough that a healthy but starved node keeps its leases, and the crashed node's
    leases are those it still held when it exited, whether or not they have expired by the time
    they are read."""
    n = 30
    recipe = recipe_toml(
        tmp_path / "runs",
        f'{{ name = "arith", split = "train", limit = {n} }}',
        lease_timeout_s=12.0,
    )
    df = Dataflow(tmp_path / "df", recipe)
    procs.append(df)
    crash = tmp_path / "crash-now"
    x = start_node(tmp_path, df.url, "X", "--crash-file", str(crash),
                   runner=[sys.executable, str(REPO / "tests/rollout/crashing_node.py")])  # fmt: skip
    procs.append(x)
    wait_for("node X to push", lambda: df.status()["tasks_done"] >= 2, timeout=300)
    freeze_holding_leases(df, x, "X", timeout=300)
    x_id = node_id(df, "X")
    crash.touch()
    x.signal(signal.SIGCONT)
    assert x.wait(300) == 3, x.output()[-3000:]  # EXIT_ENGINE_DEAD
    assert "engine failure" in x.output()
    # what the crashed node left behind: leases not given back (a broken node says no goodbye);
    # still active, or already expired if the machine was slow to get here
    x_leases = [
        (lease.id, lease.task_id)
        for lease in df.read(history.leases)
        if lease.node_id == x_id and lease.state in ("active", "expired")
    ]
    assert x_leases, "the crashed node should leave its leases to expire"
    assert not [
        ls for ls in df.read(history.leases) if ls.node_id == x_id and ls.state == "released"
    ]
    nodes = {nd["name"]: nd for nd in df.status()["nodes"]}
    assert nodes["X"]["state"] != "left"  # no goodbye from a broken node

    b = start_node(tmp_path, df.url, "B")
    procs.append(b)
    _finish(df, b, timeout=600)
    winners = assert_every_task_once(df, n)
    b_id = node_id(df, "B")
    states = _lease_states(df, [lid for lid, _ in x_leases])
    for lid, task_id in x_leases:
        assert states[lid][0] in ("expired", "superseded"), (lid, states[lid])
        assert winners[task_id] == b_id
    # no heartbeat since the crash: shown silent once lease_timeout_s has passed without one
    wait_for(
        "node X to show silent",
        lambda: next(nd for nd in df.status()["nodes"] if nd["name"] == "X")["state"] == "silent",
        timeout=120,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_rollout(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "astraflow.cli.main", "serve", "rollout", *args],
        cwd=REPO, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_startup_errors_and_recipe_endpoint(tmp_path, procs):
    df = Dataflow(tmp_path / "df", arith_recipe(tmp_path / "runs", 4))
    procs.append(df)
    # GET /recipe: the resolved recipe, behind the token
    assert df.client.recipe() == load_recipe(df.recipe)
    with SyncDataflowClient(df.url, "wrong-token", retries=0) as bad, pytest.raises(AuthError):
        bad.recipe()

    wrong = _serve_rollout("--join", df.url, "--token", "wrong-token")
    assert wrong.returncode == 1
    assert "rejected the run token" in wrong.stderr + wrong.stdout
    assert not df.status()["nodes"]  # it never registered

    url = f"http://127.0.0.1:{_free_port()}"
    t0 = time.monotonic()
    gone = _serve_rollout("--join", url, "--token", TOKEN)
    elapsed = time.monotonic() - t0
    assert gone.returncode == 1
    out = gone.stderr + gone.stdout
    assert f"cannot reach the dataflow service at {url}" in out, out
    # a handful of quick retries, not the minutes of backoff used mid-run (generous bound: the
    # process start alone takes seconds on a loaded machine)
    assert elapsed < 60, elapsed


def test_push_retry_after_lost_reply_lands_once(tmp_path, procs):
    n = 6
    df = Dataflow(tmp_path / "df", arith_recipe(tmp_path / "runs", n))
    procs.append(df)
    with DroppingProxy(df.url, b"POST /trajectories", drop=2) as proxy:
        a = start_node(tmp_path, proxy.url, "A")
        procs.append(a)
        _finish(df, a)
    assert proxy.dropped == 2
    # each push whose reply was lost was sent again byte for byte (same idempotency key)
    for body in proxy.bodies[:2]:
        assert proxy.bodies.count(body) >= 2
    assert_every_task_once(df, n)
    assert len(df.read(history.episodes)) == n * GROUP_SIZE
    assert "already landed" in a.output()
