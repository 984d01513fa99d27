"""GET /status through the typed client, and the one renderer behind both live views.

Against a real service on loopback: the client decodes the typed ``DataflowStatus`` (the JSON a
raw HTTP reader gets is the same document), the launcher reads it through the client, and
``astraflow status`` and the launcher's panel draw it with the same tables.
"""

from __future__ import annotations

import json
import os
import sys

import httpx
import pytest
from dataflow_helpers import TOKEN, ThreadedService, group, make_recipe
from rich.console import Console

from astraflow.launch.live import MetricsTail, render, render_status, status_line
from astraflow.launch.local import LocalLauncher, RunHandle
from astraflow.launch.processes import Service
from astraflow.launch.security import RunSecurity
from astraflow.protocol import DataflowStatus, NodeStatus, PolicyStatus
from astraflow.protocol.client import SyncDataflowClient


def _text(renderable) -> str:
    console = Console(width=260, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


@pytest.fixture
def running(tmp_path):
    """A service with one node, 8 zero-variance samples dropped, 4 buffered, one evaluation."""
    recipe = make_recipe(
        tmp_path,
        dataflow={"lease_timeout_s": 30.0, "policies": [{"name": "zero_variance_filter"}]},
    )
    with (
        ThreadedService(recipe, tmp_path / "df.db") as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=0) as client,
    ):
        node = client.register(policies={"policy": 0}, name="box-1", region="eu").node_id
        leases = client.lease(node_id=node, max_tasks=3, versions={"policy": 0}).leases
        for lease, rewards in zip(leases, ([1] * 4, [0] * 4, [0, 1, 1, 0]), strict=True):
            client.push(node_id=node, lease_id=lease.id, episodes=group(lease.task.id, rewards))
        client.request_evaluation(policy="policy", version=0, num_tasks=5)
        yield svc, client


def test_client_status_is_typed_and_the_wire_document_is_unchanged(running):
    svc, client = running
    st = client.status()
    assert isinstance(st, DataflowStatus)
    assert isinstance(st.policies["policy"], PolicyStatus) and isinstance(st.nodes[0], NodeStatus)
    assert st.policies["policy"].dropped == {"zero_variance": 8}
    assert st.policies["policy"].buffer_samples == 4 and st.nodes[0].name == "box-1"
    # readers written against the dict keep working: item access and .get, nested
    assert st["policies"]["policy"]["dropped"] == {"zero_variance": 8}
    assert st["nodes"][0]["region"] == "eu" and st.get("nope", 7) == 7 and "round" in st
    with pytest.raises(KeyError):
        st["nope"]
    # a raw HTTP reader gets the same document as JSON
    raw = httpx.get(
        f"{svc.url}/status",
        headers={"authorization": f"Bearer {TOKEN}", "accept": "application/json"},
    ).json()
    assert set(raw) == set(DataflowStatus.model_fields)
    assert raw["policies"]["policy"]["dropped"] == {"zero_variance": 8}
    assert DataflowStatus.model_validate(raw).nodes[0].id == st.nodes[0].id


def test_launcher_reads_status_through_the_client(running, tmp_path):
    svc, _ = running
    launcher = LocalLauncher(make_recipe(tmp_path), tmp_path / "run")
    launcher.handle = RunHandle(tmp_path / "run", svc.url, TOKEN)
    launcher.security, launcher.token = RunSecurity(TOKEN), TOKEN
    st = launcher.status()
    assert isinstance(st, DataflowStatus) and st.nodes[0].name == "box-1"
    launcher.stop()
    # a wrong token or no service: no status (the watch loop carries on), not an exception
    launcher.token = "wrong-token"
    assert launcher.status() is None
    launcher.stop()
    launcher.handle.url, launcher.token = "http://127.0.0.1:9", TOKEN
    assert launcher.status() is None
    launcher.stop()


def test_both_views_draw_the_same_tables(running, tmp_path):
    _, client = running
    st = client.status()
    cli_view = _text(render(st))
    for needle in (
        "policies",
        "rollout nodes",
        "box-1",
        "eu",
        "dropped samples: policy: zero_variance 8",
        "evaluations",
    ):
        assert needle in cli_view, f"{needle!r} missing from:\n{cli_view}"
    assert "0/5" in cli_view and "reward" not in cli_view  # no metrics without a run directory

    metrics = tmp_path / "metrics.jsonl"
    step = {"type": "step", "policy": "policy", "time": 1.0, "samples": 8, "reward_mean": 0.625}
    metrics.write_text(json.dumps(step) + "\n" + json.dumps({**step, "time": 3.0}) + "\n")

    done = Service("node-0", [sys.executable, "-c", "pass"], tmp_path / "node-0.log")
    done.start(dict(os.environ)).proc.wait(timeout=60)
    panel = _text(render_status(st, [done], "runs/x", started=0.0, tail=MetricsTail(metrics)))
    assert "node-0:exit 0" in panel and "runs/x" in panel
    for needle in ("box-1", "eu", "dropped samples: policy: zero_variance 8", "evaluations", "0/5"):
        assert needle in panel, f"{needle!r} missing from:\n{panel}"
    assert "reward" in panel and "0.625" in panel  # the newest step's reward
    assert "8.0" in panel  # samples/s: 16 samples over 2 s
    line = status_line(st, 12.0, MetricsTail(metrics))
    assert "policy: step 0/5 v-" in line and "reward 0.625" in line
    assert "dropped policy: zero_variance 8" in line  # drop counts by reason, in the plain line
    waiting = _text(render_status(None, [], "runs/x", started=0.0))
    assert "waiting for the dataflow service" in waiting


def test_live_view_at_80_columns_shows_drops_and_errors_in_full(running):
    """Issue 28: drop reasons were cut to 'zero_varian…' and failed episodes lived only in the
    node's log. At 80 columns the view names every drop reason and each error reason with its
    first message."""
    from dataflow_helpers import episode

    svc, client = running
    node = client.register(policies={"policy": 0}, name="box-2").node_id
    message = "BadRequest: prompt has 443 tokens; the model's context is 256"
    for lease in client.lease(node_id=node, max_tasks=8, versions={"policy": 0}).leases:
        n = lease.task.group_size
        failed = [episode(lease.task.id, error=message) for _ in range(n)]
        assert client.push(node_id=node, lease_id=lease.id, episodes=failed).accepted
    console = Console(width=80, record=True, color_system=None)
    console.print(render(client.status()))
    text = console.export_text()
    view = " ".join(text.split())
    assert "zero_variance 8" in view and "…" not in text  # tables wrap, nothing is cut
    assert "failed episodes: episode_error: " in view and f"— {message}" in view
    assert max(len(line) for line in text.splitlines()) <= 80


def test_status_cli_with_run_dir_shows_the_autoscaler(running, tmp_path):
    """``astraflow status URL --run-dir``: the service's tables under the autoscaler's line,
    read from the run's ``autoscale.jsonl``."""
    from astraflow.cli.main import app
    from typer.testing import CliRunner

    from astraflow.launch.scaling import AutoscaleLog

    svc, _ = running
    figures = {"nodes": 2, "groups_per_node": 2, "in_flight": 3, "trainer_idle": 0.4,
               "buffer_fill": None}  # fmt: skip
    log = AutoscaleLog(tmp_path / "autoscale.jsonl")
    log.write({"decision": "grow", "reason": "trainer starved", "pool": 1, "target": 2,
               "nodes": ["node-1"], "figures": figures})  # fmt: skip
    log.write({"decision": "hold", "reason": "cooldown (20s left)", "pool": 2, "target": 2,
               "figures": figures})  # fmt: skip
    args = ["status", svc.url, "--token", TOKEN, "--once"]
    with_dir = CliRunner().invoke(app, [*args, "--run-dir", str(tmp_path)], env={"COLUMNS": "240"})
    assert with_dir.exit_code == 0, with_dir.output
    assert "autoscale: pool 2 · trainer idle 0.40 · 3/4 group slots in flight" in with_dir.output
    assert "hold: cooldown (20s left) · last change: grow to 2" in with_dir.output
    assert "box-1" in with_dir.output  # the service's tables follow
    plain = CliRunner().invoke(app, args, env={"COLUMNS": "240"})
    assert plain.exit_code == 0 and "autoscale:" not in plain.output


def test_status_lists_a_bounded_number_of_nodes_and_counts_them_all(tmp_path, monkeypatch):
    """A pool of thousands of nodes made /status a megabyte built on the store's writer thread;
    it lists at most STATUS_NODES_LISTED active nodes (the silent ones first: the ones to look
    at) plus the last that left, and node_summary counts every one of them."""
    from dataflow_helpers import ManualClock

    from astraflow.dataflow.ops import status as status_ops

    monkeypatch.setattr(status_ops, "STATUS_NODES_LISTED", 3)
    clock = ManualClock()
    recipe = make_recipe(tmp_path, dataflow={"lease_timeout_s": 30.0})
    with (
        ThreadedService(recipe, tmp_path / "df.db", config_kwargs={"clock": clock}) as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=0) as client,
    ):
        ids = [
            client.register(
                policies={"policy": 0}, name=f"n{i}", region="eu" if i < 4 else "us"
            ).node_id
            for i in range(6)
        ]
        clock.advance(60.0)  # past the lease timeout: every node is silent ...
        for nid in ids[:5]:  # ... but the last one, registered last
            client.heartbeat(nid)
        client.deregister(ids[0])
        st = client.status()
        shown = {n.name: n.state for n in st.nodes}
        assert shown == {"n0": "left", "n5": "silent", "n1": "active", "n2": "active"}
        s = st.node_summary
        assert (s.active, s.silent, s.left, s.listed) == (4, 1, 1, 4)
        assert s.regions["eu"].active == 3 and s.regions["us"].active == 1
        assert s.regions["us"].silent == 1
        # the live view says how many it does not show
        assert "3 of 5 registered nodes shown" in _text(render(st))


def test_live_view_fits_100_columns_with_an_eta(running, tmp_path):
    """The launcher's view needed ~150 columns and had no ETA: at 100 every header and cell is
    whole (no word folded), and each policy's ETA comes from its recent step pace."""
    from astraflow.launch.live import duration

    _, client = running
    st = client.status()
    metrics = tmp_path / "metrics.jsonl"
    steps = [{"type": "step", "policy": "policy", "time": 100.0 + 3.0 * i, "samples": 8,
              "reward_mean": 0.625, "staleness_mean": 0.5} for i in range(4)]  # fmt: skip
    metrics.write_text("".join(json.dumps(r) + "\n" for r in steps))
    tail = MetricsTail(metrics)
    console = Console(width=100, record=True, color_system=None)
    console.print(render_status(st, [], "runs/quickstart", started=0.0, tail=tail))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 100
    words = set(text.split())
    # 5 steps to go at 3 s a step (the policy is at 0/5: the status is the service's)
    assert tail.eta_s("policy", 0, 5) == 15.0 and "15s" in words and "ETA" in words
    for header in ("policy", "step", "eval", "acc", "reward", "smp/s", "stale", "buffer",
                   "node", "region", "state", "versions", "leases", "episodes", "tok/s"):  # fmt: skip
        assert header in words, f"{header!r} folded or missing:\n{text}"
    node = st.nodes[0]
    assert node.id[:13] in words and "box-1" in words and "policy:v0" in words
    assert duration(45) == "45s" and duration(725) == "12m05s" and duration(11220) == "3h07m"
    assert "ETA" in status_line(st, 12.0, MetricsTail(metrics))
