"""A node told it was deregistered does not linger: it exits non-zero, so its supervisor (the
launcher) starts a fresh one that registers again. Real processes on loopback."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rollout"))
from node_helpers import TOKEN, Dataflow, arith_recipe, node_id, start_node, wait_for  # noqa: E402

from astraflow.protocol.client import SyncDataflowClient  # noqa: E402

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


def test_a_deregistered_node_exits_non_zero(tmp_path):
    df = Dataflow(tmp_path / "df", arith_recipe(tmp_path / "runs", 200))
    node = None
    try:
        node = start_node(tmp_path, df.url, "X")
        wait_for("node X to push", lambda: df.status()["tasks_done"] >= 1, timeout=120)
        with SyncDataflowClient(df.url, TOKEN, retries=0) as admin:  # the run secret: admin
            assert admin.deregister(node_id(df, "X")).ok
        code = node.wait(60)
        assert code not in (0, None), node.output()[-3000:]
        assert "was deregistered" in node.output()
    finally:
        if node is not None:
            node.stop()
        df.stop()
