"""Episodes survive a node's death: SIGKILL a node in the middle of multi-turn episodes; another
node finishes them from their saved turn.

Real processes: ``astraflow serve dataflow`` and two rollout nodes (``tests/rollout/scripted_node.py``:
the real node with scripted engines, so each node's turns are told apart by their text and by the
weight version they carry: node A answers "alpha" at version 3, node B "beta" at version 8) over
the math multi-turn env behind a fixed tool latency, each episode saved after every turn
(``rollout.checkpoint_after_s = 0``). A is frozen (SIGSTOP) at a moment when every episode of its
group has been saved at turn 2 or later, the saves are read from the store, and A is killed.
Checked on the store through ``storage.history``: B won A's task, none of its episodes of that
task started from scratch (each resumed from exactly the turn saved), and the samples buffered
for training carry A's saved turns (tokens, log-probs, loss mask, versions) unchanged, followed
by B's turns only.

A node that leaves on purpose (SIGTERM: an operator, the autoscaler's shrink) hands its episodes
back the same way with periodic saves off: while it drains, every finished turn is saved, and
what the drain timeout cuts is released at its last turn.
"""

from __future__ import annotations

import signal
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from astraflow.dataflow.storage import history

sys.path.insert(0, str(Path(__file__).resolve().parent))

from node_helpers import (  # noqa: E402
    REPO,
    Dataflow,
    multi_turn_recipe,
    node_id,
    start_node,
    wait_for,
)

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

N_TASKS = 4
GROUP = 2
MAX_TURNS = 6
A_VERSION, B_VERSION = 3, 8


def _scripted(tmp_path, df, name, reply, version, *extra):
    return start_node(
        tmp_path, df.url, name, "--reply", reply, "--version", str(version), *extra,
        runner=[sys.executable, str(REPO / "tests/rollout/scripted_node.py")],
    )  # fmt: skip


def _freeze_with_group_saved(df, proc, name, timeout=90.0):
    """SIGSTOP ``proc`` at a moment when it holds an active lease whose every episode is saved
    at turn 2 or later and still in flight; returns (lease, saved episodes by index)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        proc.signal(signal.SIGSTOP)
        node = df.node(name)
        if node is not None:
            active = [
                lease
                for lease in df.read(history.leases)
                if lease.node_id == node["id"] and lease.state == "active"
            ]
            saved = df.read(history.partials)
            for lease in active:
                mine = {r.index: r.partial for r in saved if r.lease_id == lease.id}
                if len(mine) == GROUP and all(
                    p.finished is None and p.turns >= 2 for p in mine.values()
                ):
                    return lease, mine
        proc.signal(signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError(f"node {name} never had a whole group saved in flight")


def _generated_versions(sample, lo: int, hi: int) -> set[int]:
    """Versions of the generated tokens (loss mask 1) of ``sample`` in ``[lo, hi)``."""
    mask = sample.loss_mask[lo:hi]
    return {v for v, m in zip(sample.versions[lo:hi], mask, strict=True) if m}


def test_sigkilled_nodes_episodes_finish_elsewhere_from_their_saved_turn(tmp_path, procs):
    df = Dataflow(
        tmp_path / "df",
        multi_turn_recipe(
            tmp_path / "runs",
            "resume",
            group=GROUP,
            n_tasks=N_TASKS,
            max_turns=MAX_TURNS,
            checkpoint_after_s=0.0,
        ),
    )
    procs.append(df)
    a = _scripted(tmp_path, df, "A", "alpha", A_VERSION)
    procs.append(a)
    lease_a, saved = _freeze_with_group_saved(df, a, "A")
    a.signal(signal.SIGKILL)
    assert a.wait(10) == -signal.SIGKILL
    task_id = lease_a.task_id

    b = _scripted(tmp_path, df, "B", "beta", B_VERSION)
    procs.append(b)
    wait_for("every task done", lambda: df.status()["tasks_done"] == N_TASKS, timeout=150)
    b_id = node_id(df, "B")

    tasks = {t.id: t for t in df.read(history.tasks)}
    leases = {lease.id: lease for lease in df.read(history.leases)}
    winner = leases[tasks[task_id].winner]
    assert winner.node_id == b_id and winner.id != lease_a.id
    assert leases[lease_a.id].state in ("expired", "superseded")

    # B's episodes of A's task: each resumed from the turn A saved, none from scratch
    episodes = [e for e in df.read(history.episodes) if e.lease_id == winner.id]
    assert len(episodes) == GROUP
    resumed = Counter(int(e.info["metrics"]["resumed_turns"]) for e in episodes)
    assert resumed == Counter(p.turns for p in saved.values())
    assert all(e.finish_reason == "truncated" and e.error is None for e in episodes)

    # the samples a trainer would be served: A's saved turns unchanged, then only B's turns
    by_turns = {p.turns: p.trajectories[0] for p in saved.values()}
    resumed_of = {e.id: int(e.info["metrics"]["resumed_turns"]) for e in episodes}
    samples = [s for s in df.read(history.sample_arrays) if s.lease_id == winner.id]
    assert sorted(s.episode_id for s in samples) == sorted(resumed_of)
    for s in samples:
        before = by_turns[resumed_of[s.episode_id]]
        n = len(before.tokens)
        assert s.tokens[:n] == before.tokens
        assert s.loss_mask[:n] == before.loss_mask
        assert s.logprobs[:n] == before.logprobs
        assert s.versions[:n] == before.versions
        assert _generated_versions(s, 0, n) == {A_VERSION}
        assert _generated_versions(s, n, len(s.tokens)) == {B_VERSION}
        assert (
            sum(1 for i in range(1, len(s.loss_mask)) if s.loss_mask[i] > s.loss_mask[i - 1])
            == MAX_TURNS
        )
    # every task is done: nothing is kept to resume
    assert df.read(history.partials) == []


def test_drained_node_hands_its_episodes_back_at_their_last_turn(tmp_path, procs):
    """Periodic saves off (``checkpoint_after_s`` unset): SIGTERM A while it plays 12-turn
    episodes, with a drain timeout far shorter than an episode. A saves each turn it finishes
    while draining, releases its leases and exits 0; B resumes every one of those episodes from
    A's last saved turn, none from scratch."""
    max_turns = 12
    df = Dataflow(
        tmp_path / "df",
        multi_turn_recipe(
            tmp_path / "runs",
            "drain",
            group=GROUP,
            n_tasks=N_TASKS,
            max_turns=max_turns,
            checkpoint_after_s=None,
        ),
    )
    procs.append(df)
    a = _scripted(tmp_path, df, "A", "alpha", A_VERSION, "--drain-timeout", "2")
    procs.append(a)
    a_id = wait_for("A registered", lambda: df.node("A"), timeout=60)["id"]

    def a_leases():
        return [lease for lease in df.read(history.leases) if lease.node_id == a_id]

    wait_for("A holding leases", lambda: [x for x in a_leases() if x.state == "active"])
    time.sleep(1.0)  # a turn or two into its episodes (0.4 s of env latency per turn)
    assert df.read(history.partials) == []  # nothing saved before the drain
    a.signal(signal.SIGTERM)
    assert a.wait(30) == 0
    released = [x for x in a_leases() if x.state == "released"]
    assert released, [x.state for x in a_leases()]
    saved = {(r.task_id, r.index): r.partial.turns for r in df.read(history.partials)}
    for lease in released:
        assert {i for t, i in saved if t == lease.task_id} == set(range(GROUP))
    assert all(turns >= 1 for turns in saved.values())
    assert df.status()["saved_episodes"] == len(saved)

    b = _scripted(tmp_path, df, "B", "beta", B_VERSION)
    procs.append(b)
    wait_for("every task done", lambda: df.status()["tasks_done"] == N_TASKS, timeout=150)
    tasks = {t.id: t for t in df.read(history.tasks)}
    leases = {lease.id: lease for lease in df.read(history.leases)}
    episodes = df.read(history.episodes)
    for lease in released:
        winner = tasks[lease.task_id].winner
        assert leases[winner].node_id == node_id(df, "B")
        resumed = sorted(
            int(e.info["metrics"]["resumed_turns"]) for e in episodes if e.lease_id == winner
        )
        want = sorted(turns for (t, _), turns in saved.items() if t == lease.task_id)
        assert resumed == want and all(r >= 1 for r in resumed)
    assert df.read(history.partials) == []
    assert df.status()["saved_episodes"] == 0
