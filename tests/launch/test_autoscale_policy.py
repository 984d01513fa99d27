"""The autoscaler's decision rules (:mod:`astraflow.launch.autoscale`), on figures alone."""

from __future__ import annotations

import pytest

from astraflow.launch.autoscale import Autoscaler, Figures, figures, groups_per_node
from astraflow.protocol.status import DataflowStatus, NodeStatus, PolicyStatus
from astraflow.recipe.schema import AutoscaleConfig


def cfg(**kw) -> AutoscaleConfig:
    base = {"enabled": True, "min_nodes": 1, "max_nodes": 4, "target_trainer_idle": 0.2,
            "cooldown_s": 10.0, "interval_s": 1.0, "sustain": 2}  # fmt: skip
    return AutoscaleConfig(**{**base, **kw})


def fig(**kw) -> Figures:
    base = {"pool": 2, "starting": 0, "draining": 0, "nodes": 2, "groups_per_node": 2,
            "in_flight": 4, "trainer_idle": 0.1, "buffer_fill": None, "training_done": False}  # fmt: skip
    return Figures(**{**base, **kw})


STARVED_FULL = {"trainer_idle": 0.6, "in_flight": 4}
FED_SLACK = {"trainer_idle": 0.05, "in_flight": 2}


def test_grows_a_starved_full_pool_after_sustain_then_cools_down():
    a = Autoscaler(cfg())
    first = a.decide(fig(**STARVED_FULL), 0.0)
    assert first.action == "hold" and "1/2 intervals" in first.reason
    second = a.decide(fig(**STARVED_FULL), 1.0)
    # busy 0.4 of the time where 0.8 is wanted: twice the pool
    assert (second.action, second.pool, second.target) == ("grow", 2, 4)
    assert "idle 0.60 > 0.2" in second.reason and "4/4 group slots" in second.reason
    # the new node is up and the load still calls for more, but the cooldown holds
    cooling = a.decide(fig(pool=3, nodes=3, trainer_idle=0.6, in_flight=6), 5.0)
    assert cooling.action == "hold" and "cooldown" in cooling.reason
    a = Autoscaler(cfg(max_nodes=8))
    a.decide(fig(pool=3, nodes=3, trainer_idle=0.6, in_flight=6), 11.5)
    assert a.decide(fig(pool=3, nodes=3, trainer_idle=0.6, in_flight=6), 12.5).target == 6


@pytest.mark.parametrize(
    "idle, pool, target",
    [(0.21, 2, 3), (0.5, 2, 4), (0.99, 2, 4), (0.3, 1, 2)],  # at least one, at most max_nodes
)
def test_grows_by_the_shortfall(idle, pool, target):
    a = Autoscaler(cfg(sustain=1))
    d = a.decide(fig(trainer_idle=idle, pool=pool, nodes=pool, in_flight=2 * pool), 0.0)
    assert (d.action, d.target) == ("grow", target)


def test_an_interrupted_streak_starts_over():
    a = Autoscaler(cfg(sustain=3))
    a.decide(fig(**STARVED_FULL), 0.0)
    a.decide(fig(**STARVED_FULL), 1.0)
    assert a.decide(fig(), 2.0).action == "hold"  # fed and full: the streak ends
    a.decide(fig(**STARVED_FULL), 3.0)
    a.decide(fig(**STARVED_FULL), 4.0)
    assert a.decide(fig(**STARVED_FULL), 5.0).action == "grow"


def test_starved_with_free_slots_holds():
    """Admission or a lack of tasks holds the nodes back: more nodes would not feed the trainer."""
    a = Autoscaler(cfg(sustain=1))
    d = a.decide(fig(trainer_idle=0.9, in_flight=3, nodes=2, pool=2), 0.0)
    assert d.action == "hold" and "free slots" in d.reason


def test_shrinks_when_the_work_fits_one_node_fewer_and_the_trainer_is_fed():
    a = Autoscaler(cfg(sustain=1))
    first = a.decide(fig(**FED_SLACK), 0.0)
    assert first.action == "hold" and "for 0s of 10s" in first.reason
    d = a.decide(fig(**FED_SLACK), 10.0)  # the surplus lasted the cooldown
    assert (d.action, d.target) == ("shrink", 1)
    assert "fits on one node fewer" in d.reason


@pytest.mark.parametrize("idle", [0.15, 0.2])
def test_hysteresis_band_neither_grows_nor_shrinks(idle):
    """Idle between half the target and the target: fed enough not to grow, not enough to shrink."""
    a = Autoscaler(cfg(sustain=1))
    assert a.decide(fig(trainer_idle=idle, in_flight=2), 0.0).action == "hold"
    assert a.decide(fig(trainer_idle=idle, in_flight=4), 1.0).action == "hold"


def test_bounds_win_and_limits_hold():
    a = Autoscaler(cfg(sustain=1, min_nodes=2, max_nodes=3))
    below = a.decide(fig(pool=0, nodes=0), 0.0)  # below min: at once, to min
    assert (below.action, below.target) == ("grow", 2)
    a = Autoscaler(cfg(sustain=1, min_nodes=2, max_nodes=3))
    above = a.decide(fig(pool=5, nodes=5), 0.0)
    assert (above.action, above.target) == ("shrink", 3)
    at_max = Autoscaler(cfg(sustain=1, max_nodes=2)).decide(fig(**STARVED_FULL), 0.0)
    assert at_max.action == "hold" and "at max_nodes" in at_max.reason
    at_min = Autoscaler(cfg(sustain=1, min_nodes=2)).decide(fig(**FED_SLACK), 0.0)
    assert at_min.action == "hold"


def test_holds_while_starting_without_figures_and_when_done():
    a = Autoscaler(cfg(sustain=1))
    assert "starting" in a.decide(fig(starting=1, **STARVED_FULL), 0.0).reason
    assert a.decide(fig(trainer_idle=None, in_flight=4), 0.0).reason == "no trainer figures yet"
    assert a.decide(fig(training_done=True, **STARVED_FULL), 0.0).reason == "training is done"


def test_buffer_fill_target():
    a = Autoscaler(cfg(sustain=1, target_trainer_idle=None, target_buffer_fill=0.8))
    grow = a.decide(fig(buffer_fill=0.5, in_flight=4), 0.0)
    assert grow.action == "grow" and "buffer fill 0.50 < 0.8" in grow.reason
    assert grow.target == 4  # 0.8 / 0.5 of the pool of 2, rounded up
    a = Autoscaler(cfg(sustain=1, target_trainer_idle=None, target_buffer_fill=0.8))
    a.decide(fig(buffer_fill=1.0, in_flight=2), 0.0)
    assert a.decide(fig(buffer_fill=1.0, in_flight=2), 10.0).action == "shrink"
    assert a.decide(fig(buffer_fill=None), 20.0).reason == "no trainer figures yet"


def _status(nodes: list[tuple[str, str]], idle: float | None, buffered: int, in_flight: int):
    pol = PolicyStatus(trainable=True, latest_version=3, weight_location=None, steps=3,
                       max_steps=10, buffer_groups=buffered, buffer_samples=0, unacked_batches=0,
                       staleness={}, dropped={}, trainer_idle=idle, cap_groups=8)  # fmt: skip
    ns = [NodeStatus(id=f"i{k}", name=name, region="local", state=state, last_heartbeat=0.0,
                     seconds_since_heartbeat=0.0, versions={}, episodes=0, episodes_per_s=0.0,
                     active_leases=0) for k, (name, state) in enumerate(nodes)]  # fmt: skip
    return DataflowStatus(run="r", mode="async", time=0.0, done=False, training_done=False,
                          queue={}, in_flight_leases=in_flight, training_in_flight=in_flight,
                          expired_leases=0, tasks_done=0, episodes=0, episodes_per_s=0.0,
                          nodes=ns, policies={"policy": pol}, evaluations=[],
                          dataflow_policies=[])  # fmt: skip


def test_figures_from_status():
    st = _status(
        [("node-0", "active"), ("node-1", "active"), ("node-2", "left"), ("ext", "active")],
        idle=0.4, buffered=2, in_flight=4,
    )  # fmt: skip
    f = figures(st, pool={"node-0", "node-3"}, draining={"node-1"}, groups_per_node=2)
    # node-3 is started but not registered yet; node-1 drains; "ext" joined from elsewhere and
    # takes no work (no leases, no episodes), so it is no capacity (issue 48 #7)
    assert (f.pool, f.starting, f.draining, f.nodes) == (2, 1, 1, 1)
    assert (f.in_flight, f.trainer_idle, f.buffer_fill) == (4, 0.4, 0.75)


def test_groups_per_node():
    assert groups_per_node(16, 4) == 4
    assert groups_per_node(4, 8) == 1  # a group larger than the node runs alone


def drive(a: Autoscaler, t0: float, seconds: int, done0: int, rate: float, **kw):
    """One decision a second for ``seconds`` seconds while ``rate`` groups a second are done;
    returns the decisions and the groups done at the end."""
    out = []
    for i in range(seconds):
        out.append(a.decide(fig(tasks_done=done0 + round(rate * i), **kw), t0 + i))
    return out, done0 + round(rate * seconds)


def slow_cfg(**kw) -> AutoscaleConfig:
    return cfg(**{"target_trainer_idle": None, "target_buffer_fill": 0.9, "cooldown_s": 3.0,
                  "sustain": 1, "max_nodes": 8, **kw})  # fmt: skip


def test_demand_is_littles_law_over_the_window():
    a = Autoscaler(slow_cfg())
    # fast groups: 8 done a second, 8 in flight on 2 nodes of 8: a group takes 1 s
    _, done = drive(a, 0.0, 6, 0, 8.0, pool=2, nodes=2, groups_per_node=8, in_flight=8,
                    buffer_fill=1.0, buffered=10)  # fmt: skip
    d = a.demand(fig(groups_per_node=8))
    assert d is not None and d.rate == pytest.approx(8.0) and d.group_s == pytest.approx(1.0)
    assert (d.load, d.nodes) == (pytest.approx(1.0), 1)
    # groups slow down: 2 done a second with 16 in flight is 8 s a group; the trainer's pace is
    # the fastest seen, so 8 groups/s x 8 s = 64 groups in flight = 8 nodes
    drive(a, 6.0, 6, done, 2.0, pool=2, nodes=2, groups_per_node=8, in_flight=16,
          buffer_fill=1.0, buffered=10)  # fmt: skip
    d = a.demand(fig(groups_per_node=8))
    assert d.rate == pytest.approx(8.0) and d.group_s == pytest.approx(8.0) and d.nodes == 8
    assert "demand 8.00 groups/s x 8.0 s a group = 8.00 nodes of 8 groups" in d.describe()


def test_grows_by_the_whole_demand_at_once_and_ahead_of_starving():
    """Full nodes whose groups slow down: the pool grows to the demand in one change, before the
    buffer runs dry (the fill-based shortfall would add one node: 0.9 / 0.8 of 2, rounded up)."""
    a = Autoscaler(slow_cfg(max_nodes=4))
    _, done = drive(a, 0.0, 6, 0, 8.0, pool=2, nodes=2, groups_per_node=8, in_flight=8,
                    buffer_fill=1.0, buffered=10)  # fmt: skip
    ds, _ = drive(a, 6.0, 6, done, 2.0, pool=2, nodes=2, groups_per_node=8, in_flight=16,
                  buffer_fill=1.0, buffered=10)  # fmt: skip
    grows = [d for d in ds if d.action == "grow"]
    # the first window still mixes fast groups (2.1 s a group: 3 nodes); the next shows 8 nodes
    assert [(d.pool, d.target) for d in grows] == [(2, 3), (2, 4)]
    assert "demand outgrows the pool" in grows[0].reason  # the trainer is still fed
    assert "nodes of 8 groups" in grows[0].reason


def test_tops_up_the_deficit_while_nodes_start():
    """A grow called on a window that still mixes fast groups falls short; once the window shows
    the slow groups the deficit is added without waiting for the starting node."""
    a = Autoscaler(slow_cfg(max_nodes=4))
    _, done = drive(a, 0.0, 6, 0, 8.0, pool=2, nodes=2, groups_per_node=8, in_flight=8,
                    buffer_fill=1.0, buffered=10)  # fmt: skip
    first = a.decide(fig(pool=2, nodes=2, groups_per_node=8, in_flight=16, buffer_fill=0.5,
                         buffered=2, tasks_done=done + 4), 6.0)  # fmt: skip
    assert (first.action, first.target) == ("grow", 3)  # the window: 1.2 s a group
    ds, _ = drive(a, 7.0, 8, done + 4, 1.0, pool=3, nodes=2, starting=1, groups_per_node=8,
                  in_flight=16, buffer_fill=0.5, buffered=2)  # fmt: skip
    assert ds[0].action == "hold" and "cooldown" in ds[0].reason
    top = [d for d in ds if d.action == "grow"]
    assert top and top[0].target == 4 and "1 node(s) starting" in top[0].reason


def test_no_shrink_while_the_demand_needs_the_nodes():
    """A full buffer holds groups back (admission): slots are free for a moment but the slow
    groups still need the pool; shrinking would have to be undone a node's start-up later."""
    a = Autoscaler(slow_cfg(max_nodes=4, min_nodes=2))
    _, done = drive(a, 0.0, 6, 0, 8.0, pool=2, nodes=2, groups_per_node=8, in_flight=8,
                    buffer_fill=1.0, buffered=10)  # fmt: skip
    ds, _ = drive(a, 6.0, 20, done, 2.0, pool=4, nodes=4, groups_per_node=8, in_flight=16,
                  buffer_fill=1.5, buffered=30)  # fmt: skip
    assert all(d.action == "hold" for d in ds)
    assert "too much for one node fewer" in ds[-1].reason


def test_shrinks_one_node_after_the_surplus_lasts_the_cooldown():
    a = Autoscaler(slow_cfg(cooldown_s=5.0))
    slack = {"pool": 3, "nodes": 3, "groups_per_node": 8, "in_flight": 4, "buffer_fill": 1.0,
             "buffered": 20}  # fmt: skip
    ds, done = drive(a, 0.0, 4, 0, 8.0, **slack)
    assert all(d.action == "hold" for d in ds) and "for 3s of 5s" in ds[-1].reason
    # the surplus breaks (the nodes fill up): its clock starts over
    a.decide(fig(tasks_done=done, **{**slack, "in_flight": 24}), 4.0)
    ds, done = drive(a, 5.0, 6, done, 8.0, **slack)
    assert [d.action for d in ds] == ["hold"] * 5 + ["shrink"]
    assert ds[-1].target == 2 and "fits on one node fewer" in ds[-1].reason
    # the next node needs a surplus of its own
    ds, done = drive(a, 11.0, 4, done, 8.0, **{**slack, "pool": 2, "nodes": 2})
    assert all(d.action == "hold" for d in ds)
    assert a.decide(fig(tasks_done=done, **{**slack, "pool": 2, "nodes": 2}), 15.0).target == 1


def test_no_shrink_into_a_pool_the_demand_would_nearly_fill():
    """The shrink's demand bound sits below the grow's: a pool of 3 whose demand is 2 nodes (all
    of one node fewer) holds, else a window a little slower would grow it back (a flap)."""
    a = Autoscaler(slow_cfg())
    slack = {"pool": 3, "nodes": 3, "groups_per_node": 2, "buffer_fill": 1.0, "buffered": 8}
    # 20 groups/s while fed: the pace; 4 in flight at 20 groups/s is 0.2 s a group: 2 nodes
    ds, _ = drive(a, 0.0, 16, 0, 20.0, in_flight=4, **slack)
    d = a.demand(fig(groups_per_node=2))
    assert (d.rate, d.group_s, d.load) == (
        pytest.approx(20.0),
        pytest.approx(0.2),
        pytest.approx(2),
    )
    assert all(x.action == "hold" for x in ds) and "too much for one node fewer" in ds[-1].reason
