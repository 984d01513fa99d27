"""Issue 48 #8: metric labels a node cannot collide, a read-only dashboard token that is never
printed, run files 0600, and a dashboard that answers a bearer header with 200 or 401, never 500.

Why: a node names itself, so a fake ``node-0`` duplicated the real node's Prometheus series; the
dashboard's token was the admin secret and was printed into every launcher log; ``dataflow.db``
was 0644, readable by policy code running as another user; and the dashboard compared a bytes
header token with a str token, which raised (500).
"""

from __future__ import annotations

import stat
from pathlib import Path

import httpx
from dataflow_helpers import TOKEN, ThreadedService, make_recipe
from hostile import NODE_TOKEN

from astraflow.launch.dashboard import (
    DashboardSource,
    create_dashboard_app,
    printable_address,
    serve_dashboard,
)
from astraflow.launch.security import RunSecurity, dashboard_token
from astraflow.protocol.client import SyncDataflowClient
from astraflow.weights.server import serve_in_thread


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_two_nodes_with_one_name_get_two_prometheus_series(tmp_path):
    with (
        ThreadedService(make_recipe(tmp_path), tmp_path / "df.db") as svc,
        SyncDataflowClient(svc.url, NODE_TOKEN, retries=0) as real,
        SyncDataflowClient(svc.url, NODE_TOKEN, retries=0) as fake,
    ):
        a = real.register(policies={"policy": 0}, name="node-0").node_id
        b = fake.register(policies={"policy": 0}, name="node-0").node_id
        text = httpx.get(
            f"{svc.url}/metrics", headers={"authorization": f"Bearer {TOKEN}"}, timeout=10
        ).text
    series = [
        line.split(" ")[0]
        for line in text.splitlines()
        if line.startswith("astraflow_node_episodes_per_s{")
    ]
    assert len(series) == len(set(series)) == 2, series
    assert any(f'node_id="{a}"' in s for s in series) and any(f'node_id="{b}"' in s for s in series)


def test_the_store_and_run_files_are_the_owners_alone(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "recipe.toml").write_text("x")  # written before security, as the launcher does
    (run_dir / "dataflow.db").write_text("")  # a resumed run's store made 0644 before the fix
    (run_dir / "dataflow.db").chmod(0o644)
    RunSecurity.prepare(make_recipe(tmp_path), run_dir)
    assert mode(run_dir) == 0o700
    assert {p.name: mode(p) for p in run_dir.iterdir()} == {
        "recipe.toml": 0o600,
        "dataflow.db": 0o600,
        "run.secret": 0o600,
    }
    fresh = tmp_path / "fresh"
    with ThreadedService(make_recipe(tmp_path), fresh / "dataflow.db") as svc:
        with SyncDataflowClient(svc.url, NODE_TOKEN, retries=0) as node:
            node.register(policies={"policy": 0}, name="n")
        made = {p.name: mode(p) for p in fresh.iterdir() if p.name.startswith("dataflow.db")}
    assert made and set(made.values()) == {0o600}, made


def dashboard(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("")
    app = create_dashboard_app(DashboardSource(run_dir, recipe=make_recipe(tmp_path)), TOKEN)
    return serve_in_thread(app, "127.0.0.1", 0)


def test_the_dashboard_answers_any_bearer_header_with_200_or_401(tmp_path):
    url, stop = dashboard(tmp_path)
    view = dashboard_token(TOKEN)
    try:

        def get(**kw):
            return httpx.get(f"{url}/api/summary", timeout=10, **kw).status_code

        assert get(headers={"authorization": f"Bearer {TOKEN}"}) == 200  # was 500
        assert get(headers={"authorization": f"Bearer {view}"}) == 200
        assert get(params={"token": view}) == 200
        assert get(headers={"authorization": "Bearer wrong"}) == 401
        assert get(headers={"authorization": "Bearer \xe9t\xe9".encode("latin-1")}) == 401
        assert get(params={"token": "\u00e9t\u00e9"}) == 401  # non-ASCII str: was a TypeError
        assert get(params={"token": NODE_TOKEN}) == 401
    finally:
        stop()


def test_the_dashboard_token_is_read_only_and_never_printed(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    view = dashboard_token(TOKEN)
    assert view != TOKEN and TOKEN not in view
    with ThreadedService(make_recipe(tmp_path), tmp_path / "df.db") as svc:
        # the dashboard token opens nothing on the dataflow service
        for path in ("/status", "/metrics"):
            reply = httpx.get(
                f"{svc.url}{path}", headers={"authorization": f"Bearer {view}"}, timeout=10
            )
            assert reply.status_code == 401, (path, reply.status_code)
        address, stop = serve_dashboard(run_dir, svc.url, TOKEN)
        try:
            assert address.endswith(f"?token={view}") and TOKEN not in address
            written = run_dir / "dashboard.url"
            assert written.read_text().strip() == address and mode(written) == 0o600
            shown = printable_address(address, run_dir)
            assert view not in shown and TOKEN not in shown and str(written) in shown
            assert httpx.get(address, timeout=10).status_code == 200
        finally:
            stop()
