"""A remote node behind a slow, lossy link is partitioned mid-run: nothing is lost or duplicated.

A short real run (the local launcher: dataflow, trainer, one local node; ``agentic_math`` with few
steps) plus one rollout node in a network namespace behind the emulated WAN of
``bench/_netns.py`` (100 ms RTT, 50 Mbit/s, 1 % loss). While the remote node holds leases the
link is cut for longer than the lease timeout, so its leases expire and the home node redoes the
tasks; the link heals and the remote node delivers again. The store must then show no lost and no
duplicated task (``bench/_store_checks.py``). Skipped where namespaces cannot be made (not
root, no iproute2, no /dev/net/tun). The full scenario with figures is
``bench/cross_region.py``.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import _netns as N  # noqa: E402
import _store_checks as C  # noqa: E402

pytestmark = pytest.mark.nightly  # network namespaces and a WAN emulation: bench/cross_region.py

PARTITION_S = 6.0
LEASE_TIMEOUT_S = 3.0


def _wait(what: str, cond, timeout: float, poll: float = 0.25):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def test_partitioned_remote_node_loses_and_duplicates_nothing(tmp_path):
    reason = N.unavailable_reason()
    if reason:
        pytest.skip(reason)
    from astraflow.launch.local import LocalLauncher
    from astraflow.launch.processes import service_env
    from astraflow.recipe import load_recipe

    with N.RemoteRegion(tmp_path / "net") as region:
        recipe = load_recipe(
            ROOT / "recipes" / "agentic_math.toml",
            [
                "run.max_steps=22",
                f"run.output_dir={json.dumps(str(tmp_path))}",
                "policies.policy.trainer.groups_per_step=2",
                "rollout.concurrency=32",
                f"dataflow.host={json.dumps(region.home_ip)}",
                f"dataflow.lease_timeout_s={LEASE_TIMEOUT_S}",
                "evaluation.every_steps=0",
                "evaluation.at_start=false",
            ],
        )
        launcher = LocalLauncher(recipe, recipe.run.run_dir, eval_grace_s=10.0)
        node = None
        try:
            handle = launcher.start()

            def policy_status():
                return ((launcher.status() or {}).get("policies") or {}).get("policy") or {}

            def remote():
                for n in (launcher.status() or {}).get("nodes", []):
                    if n.get("name") == "remote-0" and n.get("state") == "active":
                        return n
                return None

            location = _wait(
                "the weight server", lambda: policy_status().get("weight_location"), 120
            )
            wport = int(location.rsplit(":", 1)[1])
            relay = region.relay("weights", f"{region.home_ip}:0", f"127.0.0.1:{wport}", "")
            df_port = int(handle.url.rsplit(":", 1)[1])
            node = region.start("remote-0", [
                sys.executable, "-m", "astraflow.cli.main", "serve", "rollout",
                "--join", f"http://{region.home_ip}:{df_port}",
                "--weight-cache", f"http://{region.home_ip}:{relay}",
                "--name", "remote-0", "--region", "remote", "--concurrency", "32",
            ], env=service_env(handle.token, 1))  # fmt: skip
            # partition while the remote node is working on leased groups
            _wait(
                "the remote node to deliver", lambda: (remote() or {}).get("episodes", 0) > 0, 180
            )
            _wait(
                "the remote node to hold leases", lambda: (remote() or {}).get("active_leases"), 60
            )
            region.partition(True)
            time.sleep(PARTITION_S)
            heal = region.partition(False)
            outcome = launcher.wait(timeout_s=240)
        finally:
            N.stop(node, signal.SIGTERM, timeout=20)
            launcher.stop()
    assert outcome == "done", outcome
    summary = C.summary_of(recipe.run.run_dir)
    checks = C.check_store(summary)
    assert checks["tasks_lost"] == 0, checks
    assert checks["tasks_duplicated"] == 0, checks
    # the partition outlasted the lease timeout: the remote node's leases expired and their tasks
    # were redone at home (an expired lease is later marked superseded when another one wins)
    assert checks["expired_leases"] + checks["superseded_leases"] >= 1, checks
    (node_id,) = C.node_ids(summary, name="remote-0")
    after = C.delivered_after(summary, [node_id], heal)["episodes"]
    assert after > 0, "the remote node delivered nothing after the link healed"
