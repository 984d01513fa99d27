"""The autoscaler's control loop (:class:`astraflow.launch.scaling.PoolScaler`) on stand-in node
services: what it starts, which node it drains, what it writes to ``autoscale.jsonl``."""

from __future__ import annotations

import json
from dataclasses import dataclass

from astraflow.launch.scaling import AutoscaleLog, PoolScaler, describe_log
from astraflow.protocol.status import DataflowStatus, NodeStatus, PolicyStatus
from astraflow.recipe import recipe_from_dict


@dataclass
class FakeNode:
    name: str
    code: int | None = None
    drained: bool = False

    @property
    def pid(self) -> int:
        return 1000 + int(self.name.removeprefix("node-"))

    def returncode(self) -> int | None:
        return self.code

    def drain(self) -> None:
        self.drained = True


def status(active: dict[str, int], in_flight: int, buffered: int) -> DataflowStatus:
    pol = PolicyStatus(trainable=True, latest_version=1, weight_location=None, steps=1,
                       max_steps=10, buffer_groups=buffered, buffer_samples=0, unacked_batches=0,
                       staleness={}, dropped={}, cap_groups=8)  # fmt: skip
    nodes = [NodeStatus(id=f"id-{n}", name=n, region="local", state="active", last_heartbeat=0.0,
                        seconds_since_heartbeat=0.0, versions={}, episodes=0, episodes_per_s=0.0,
                        active_leases=leases) for n, leases in active.items()]  # fmt: skip
    return DataflowStatus(run="r", mode="async", time=0.0, done=False, training_done=False,
                          queue={}, in_flight_leases=in_flight, training_in_flight=in_flight,
                          expired_leases=0, tasks_done=0, episodes=0, episodes_per_s=0.0,
                          nodes=nodes, policies={"policy": pol}, evaluations=[],
                          dataflow_policies=[])  # fmt: skip


def test_grows_new_names_drains_the_least_busy_and_logs_each_decision(tmp_path):
    recipe = recipe_from_dict({
        "policies": {"policy": {"model": "builtin:tiny-arith"}},
        "tasks": {"group_size": 4},
        "rollout": {"nodes": 2, "concurrency": 8},  # two groups per node
        "autoscale": {"enabled": True, "min_nodes": 1, "max_nodes": 4, "target_buffer_fill": 0.9,
                      "interval_s": 0.001, "cooldown_s": 0.0, "sustain": 1},
    })  # fmt: skip
    nodes = [FakeNode("node-0"), FakeNode("node-1")]

    def start(i: int) -> FakeNode:
        node = FakeNode(f"node-{i}")
        nodes.append(node)
        return node

    log = AutoscaleLog(tmp_path / "autoscale.jsonl")
    scaler = PoolScaler(recipe, log, start)
    # full (4 groups in 4 slots) and the buffer filled 4/8 < 0.9: 0.9 / 0.5 of 2 nodes -> 4
    started = scaler.step(status({"node-0": 2, "node-1": 2}, 4, 0), nodes, set())
    assert [n.name for n in started] == ["node-2", "node-3"]
    # the new nodes have not registered: hold
    scaler.next_at = 0.0
    assert scaler.step(status({"node-0": 2, "node-1": 2}, 4, 0), nodes, set()) == []
    # all up, the buffer full and the work fits on fewer nodes: drain the one with fewest leases
    scaler.next_at = 0.0
    busy = {"node-0": 1, "node-1": 0, "node-2": 1, "node-3": 0}
    scaler.step(status(busy, 2, 6), nodes, set())
    assert [n.name for n in nodes if n.drained] == ["node-3"]  # fewest leases, newest
    assert scaler.retired == {"node-3"} and set(scaler.draining) == {"node-3"}
    nodes[3].code = 0  # it finished draining
    scaler.next_at = 0.0
    scaler.step(status({k: v for k, v in busy.items() if k != "node-3"}, 2, 6), nodes, set())
    assert set(scaler.draining) == {"node-1"}  # node-3 reaped; node-1 is next (0 leases)
    assert {n.name for n in nodes if n.drained} == {"node-3", "node-1"}
    lines = [json.loads(x) for x in (tmp_path / "autoscale.jsonl").read_text().splitlines()]
    assert [r.get("decision") or r.get("event") for r in lines] == [
        "grow", "hold", "shrink", "left", "shrink"
    ]  # fmt: skip
    assert lines[0]["nodes"] == ["node-2", "node-3"] and lines[0]["pids"] == [1002, 1003]
    assert lines[0]["figures"]["buffer_fill"] == 0.5 and lines[1]["reason"] == "2 node(s) starting"
    assert lines[3] == {**lines[3], "node": "node-3", "returncode": 0}
    line = scaler.line()
    assert line.startswith("autoscale: pool 2 (1 draining) · trainer idle - · buffer fill 1.00")
    assert "last change: shrink to 2" in line
    # `astraflow status --run-dir` draws the same line from the file
    assert (
        describe_log(tmp_path / "autoscale.jsonl").split(" · last change")[0]
        == line.split(" · last change")[0]
    )
    assert describe_log(tmp_path / "missing.jsonl") is None


def test_a_node_that_cannot_start_is_logged_and_the_run_goes_on(tmp_path):
    recipe = recipe_from_dict({
        "policies": {"policy": {"model": "builtin:tiny-arith"}},
        "tasks": {"group_size": 4},
        "rollout": {"nodes": 1, "concurrency": 4},
        "autoscale": {"enabled": True, "max_nodes": 3, "target_buffer_fill": 0.9,
                      "interval_s": 0.001, "cooldown_s": 0.0, "sustain": 1},
    })  # fmt: skip

    def start(i: int) -> FakeNode:
        raise RuntimeError("node-1: no node of the Ray cluster could take its actor")

    scaler = PoolScaler(recipe, AutoscaleLog(tmp_path / "a.jsonl"), start)
    assert scaler.step(status({"node-0": 1}, 1, 0), [FakeNode("node-0")], set()) == []
    (line,) = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert line["decision"] == "hold" and line["reason"].endswith("; no node started")
    assert "could not start node-1: node-1: no node of the Ray cluster" in line["error"]
