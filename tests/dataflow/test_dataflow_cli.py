"""`astraflow serve dataflow` (port file, token) and `astraflow status --once` against it."""

from __future__ import annotations

import os
import subprocess
import sys

from dataflow_helpers import REPO, TOKEN, ServiceProcess, group, make_recipe

from astraflow.protocol.client import SyncDataflowClient


def _cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "astraflow.cli.main", *args],
        cwd=REPO,
        text=True,
        capture_output=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_serve_writes_port_file_and_status_renders(tmp_path):
    recipe = make_recipe(tmp_path, dataflow={"policies": [{"name": "zero_variance_filter"}]})
    with ServiceProcess(recipe, tmp_path / "svc", tmp_path / "df.db") as svc:
        assert svc.url.startswith("http://127.0.0.1:")
        with SyncDataflowClient(svc.url, TOKEN, retries=0) as c:
            node = c.register(policies={"policy": 0}, name="box-1").node_id
            for lease in c.lease(node_id=node, max_tasks=2, versions={"policy": 0}).leases:
                c.push(node_id=node, lease_id=lease.id, episodes=group(lease.task.id, [1] * 4))
            c.request_evaluation(policy="policy", version=0, num_tasks=5)
        out = _cli("status", svc.url, "--token", TOKEN, "--once", env={"COLUMNS": "240"})
        assert out.returncode == 0, out.stderr
        text = out.stdout
        for needle in (
            "policies",
            "rollout nodes",
            "box-1",
            "dropped samples: policy: zero_variance 8",
            "evaluations",
            "0/5",
        ):
            assert needle in text, f"{needle!r} missing from:\n{text}"
        bad = _cli("status", svc.url, "--token", "wrong", "--once")
        assert bad.returncode == 1 and "wrong run token" in bad.stderr


def test_serve_refuses_to_start_without_token(tmp_path):
    recipe = make_recipe(tmp_path)
    path = tmp_path / "r.toml"
    from astraflow.recipe import recipe_to_toml

    path.write_text(recipe_to_toml(recipe))
    env = {k: v for k, v in os.environ.items() if k != "ASTRAFLOW_TOKEN"}
    out = subprocess.run(
        [sys.executable, "-m", "astraflow.cli.main", "serve", "dataflow", "--recipe", str(path)],
        cwd=REPO,
        text=True,
        capture_output=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 1 and "no run token" in out.stderr


def test_recipe_logging_level_sets_the_service_log_level(tmp_path):
    """``logging.level`` is the service's level unless ``--log-level`` says otherwise (uvicorn's
    start-up lines are info)."""
    startup = b"Application startup complete"
    quiet = make_recipe(tmp_path, logging={"level": "warning"})
    with ServiceProcess(quiet, tmp_path / "quiet", tmp_path / "quiet.db") as svc:
        pass
    assert startup not in (svc.workdir / "service.log").read_bytes()
    loud = make_recipe(tmp_path, logging={"level": "info"})
    with ServiceProcess(loud, tmp_path / "loud", tmp_path / "loud.db") as svc:
        pass
    assert startup in (svc.workdir / "service.log").read_bytes()
    with ServiceProcess(
        loud, tmp_path / "flag", tmp_path / "flag.db", extra_args=["--log-level", "warning"]
    ) as svc:
        pass
    assert startup not in (svc.workdir / "service.log").read_bytes()
    recipe = tmp_path / "bad.toml"
    recipe.write_text((tmp_path / "flag" / "recipe.toml").read_text())
    bad = _cli("serve", "dataflow", "--recipe", str(recipe), "--log-level", "loud",
               env={"ASTRAFLOW_TOKEN": TOKEN})  # fmt: skip
    assert bad.returncode != 0 and "--log-level must be one of debug, info" in bad.stderr
