"""The autoscaler's decision: grow, shrink or hold the launcher's rollout pool, and why.

Pure: a :class:`Figures` snapshot (read from ``GET /status`` by :func:`figures`, plus what the
launcher knows of its own nodes) and the time in, a :class:`Decision` out; the launcher's control
loop (:mod:`astraflow.launch.scaling`) does the I/O. So the rules are tested without processes.

The rules, with ``gpn`` the groups one node holds (``rollout.concurrency // tasks.group_size``,
at least one):

* **demand**: the nodes the load needs, by Little's law over the last few intervals
  (:class:`Demand`): the groups the trainer consumes per second when fed (the fastest window
  seen: it consumes less only while it waits) times the seconds a group spends leased (groups in
  flight / groups done per second), over ``gpn``. A group's time is what a tool slowdown
  changes; the trainer's pace is not, so the pace learned while groups were fast still holds
  when they slow down.
* **grow**, to the whole deficit at once (the demand, at least one node more), when the nodes are
  *full* (the groups in flight take every node's slots) and either the trainer is *starved* (idle
  more than ``target_trainer_idle`` of the time, or the groups buffered and in flight fill less
  than ``target_buffer_fill`` of the admission cap) or the demand already needs more nodes than
  the pool has: a node takes seconds to start, so growing when groups slow down, before the
  buffer drains, hides that lag. A starved trainer whose nodes have free slots is held back by
  admission or by a lack of tasks, and more nodes would not feed it. Without a demand estimate
  yet (the first window), a starved pool grows by the shortfall the targets say
  (:meth:`Autoscaler._grow_by`).
* **shrink**, one node, when the groups in flight fit on one node fewer, the trainer is *fed*
  (idle at most half the target, the fill at least its target), the demand fits
  ``SHRINK_LOAD`` of one node fewer, and all three have held for ``cooldown_s`` in a row (a
  buffer that admission keeps full leaves slots free for a moment without the load having
  dropped; a shrink undone pays a node's start-up). The band between the grow and the shrink
  thresholds is the hysteresis that keeps a pool from flapping between two sizes.
* below ``min_nodes`` or above ``max_nodes``: back within the bounds at once.
* otherwise, and while a node the loop started has not registered yet, while the run has no
  trainer figures, and once training is done: **hold**.

A grow or shrink must be called for ``sustain`` intervals in a row (a status snapshot catches
groups between a push and the next lease), and waits ``cooldown_s`` after the previous change (a
new node needs time to load its model and fill; the idle window needs time to show the change).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Literal

from astraflow.protocol.status import DataflowStatus
from astraflow.recipe.schema import AutoscaleConfig

Action = Literal["grow", "shrink", "hold"]
#: Shrink only when the trainer idles at most this share of ``target_trainer_idle``.
SHRINK_IDLE_SHARE = 0.5
#: Shrink only when the demand fills at most this share of the slots of one node fewer.
SHRINK_LOAD = 0.8
#: The demand estimate reads the status snapshots of the last ``max(RATE_WINDOW_S,
#: RATE_INTERVALS * interval_s)`` seconds, and none spanning less than half of that.
RATE_WINDOW_S = 5.0
RATE_INTERVALS = 5


@dataclass(frozen=True)
class Figures:
    """What one decision reads. ``pool``: the launcher's nodes, started and not draining;
    ``starting``: those of them not registered yet; ``nodes``: nodes holding slots (the pool's
    registered nodes plus any that joined from elsewhere)."""

    pool: int
    starting: int
    draining: int
    nodes: int
    groups_per_node: int
    in_flight: int
    trainer_idle: float | None
    buffer_fill: float | None
    training_done: bool
    #: training groups done so far (``tasks_done``), None where the status has no such count
    tasks_done: int | None = None
    #: complete groups buffered for the trainable policies still training
    buffered: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Demand:
    """The load in nodes: ``rate`` groups per second the trainer consumes when fed, times
    ``group_s`` seconds a group is leased, is the groups that must be in flight; over the groups
    one node holds, the nodes."""

    rate: float
    group_s: float
    groups_per_node: int

    @property
    def load(self) -> float:
        """Nodes' worth of groups the trainer needs in flight (fractional)."""
        return self.rate * self.group_s / max(1, self.groups_per_node)

    @property
    def nodes(self) -> int:
        return max(1, math.ceil(self.load - 1e-6))

    def describe(self) -> str:
        return (
            f"demand {self.rate:.2f} groups/s x {self.group_s:.1f} s a group = "
            f"{self.load:.2f} nodes of {self.groups_per_node} groups"
        )


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    pool: int
    #: the pool size after the action
    target: int


@dataclass
class Autoscaler:
    """The decision rules with their memory: the last change and the run of equal calls."""

    config: AutoscaleConfig
    last_change: float | None = None
    _streak: tuple[Action, int] = field(default=("hold", 0))
    #: (time, tasks_done, in_flight, buffered) of the window's snapshots
    _samples: deque = field(default_factory=deque)
    #: groups per second the trainer consumes when fed: the fastest window seen
    _rate: float | None = None
    #: when the shrink call began (None: the load does not call for one)
    _surplus_since: float | None = None

    def decide(self, f: Figures, now: float) -> Decision:
        cfg = self.config
        self._observe(f, now)
        if f.training_done:
            return self._hold(f, "training is done")
        if f.pool < cfg.min_nodes:
            return self._change(f, now, "grow", f"pool {f.pool} is below min_nodes {cfg.min_nodes}")
        if f.pool > cfg.max_nodes:
            return self._change(
                f, now, "shrink", f"pool {f.pool} is above max_nodes {cfg.max_nodes}"
            )
        call, reason = self._call(f)
        # the surplus must last: when the shrink call began, kept through starting and cooldown
        if call != "shrink":
            self._surplus_since = None
        elif self._surplus_since is None:
            self._surplus_since = now
        if self.last_change is not None and now - self.last_change < cfg.cooldown_s:
            left = cfg.cooldown_s - (now - self.last_change)
            return self._hold(f, f"cooldown ({left:.0f}s left)")
        if f.starting:
            # a node takes a while to start: top up a deficit the demand shows meanwhile (the
            # starting nodes count in the pool), do nothing else until they are up
            d = self.demand(f)
            if call != "grow" or d is None or d.nodes <= f.pool:
                return self._hold(f, f"{f.starting} node(s) starting")
            reason = f"{reason}, {f.starting} node(s) starting"
        if call == "hold":
            return self._hold(f, reason)
        if call == "shrink" and self._surplus_since is not None:
            lasted = now - self._surplus_since
            if lasted < cfg.cooldown_s:
                return self._hold(f, f"{reason} for {lasted:.0f}s of {cfg.cooldown_s:g}s")
        seen, n = self._streak
        n = n + 1 if seen == call else 1
        self._streak = (call, n)
        if n < cfg.sustain:
            return self._hold(f, f"{reason} ({n}/{cfg.sustain} intervals)", keep_streak=True)
        return self._change(f, now, call, reason)

    def _observe(self, f: Figures, now: float) -> None:
        """Keep the window's snapshots and learn the fed trainer's pace from them."""
        if f.tasks_done is None or f.training_done:
            return
        window = max(RATE_WINDOW_S, RATE_INTERVALS * self.config.interval_s)
        self._samples.append((now, f.tasks_done, f.in_flight, f.buffered))
        while self._samples and now - self._samples[0][0] > window:
            self._samples.popleft()
        t0, done0, _, buf0 = self._samples[0]
        dt = now - t0
        if dt < window / 2:
            return
        # the groups that left the buffer (into batches): the trainer's pace, or less when it
        # waited; the fastest window seen is the pace it trains at when fed
        consumed = (f.tasks_done - done0) - (f.buffered - buf0)
        if consumed > 0:
            rate = consumed / dt
            self._rate = rate if self._rate is None else max(self._rate, rate)

    def demand(self, f: Figures) -> Demand | None:
        """The load's nodes from the window (None before a window's worth of snapshots or a group done in it)."""
        if self._rate is None or len(self._samples) < 2:
            return None
        t0, done0, _, _ = self._samples[0]
        t1, done1, _, _ = self._samples[-1]
        done = done1 - done0
        if t1 <= t0 or done <= 0:
            return None
        in_flight = sum(s[2] for s in self._samples) / len(self._samples)
        # Little's law: groups in flight = groups done per second x seconds a group is leased
        return Demand(self._rate, in_flight / (done / (t1 - t0)), f.groups_per_node)

    def _call(self, f: Figures) -> tuple[Action, str]:
        """What the load calls for, before bounds, cooldown and sustain."""
        cfg = self.config
        gpn = max(1, f.groups_per_node)
        slots = f.nodes * gpn
        starved, fed = self._trainer(f)
        if starved is None:
            return "hold", "no trainer figures yet"
        full = f.in_flight >= slots
        fits_fewer = f.nodes > 0 and f.in_flight <= (f.nodes - 1) * gpn
        load = f"{f.in_flight}/{slots} group slots in flight"
        d = self.demand(f)
        if d is not None:
            load += f", {d.describe()}"
        ahead = d is not None and full and d.nodes > f.pool
        if (starved and full) or ahead:
            why = f"trainer starved ({starved})" if starved else "demand outgrows the pool"
            if f.pool >= cfg.max_nodes:
                return "hold", f"{why}, {load}, at max_nodes"
            return "grow", f"{why}, {load}"
        if fed and fits_fewer and f.pool > cfg.min_nodes:
            if d is not None and d.load > SHRINK_LOAD * (f.pool - 1):
                return "hold", f"trainer fed, {load}: too much for one node fewer"
            return "shrink", f"trainer fed ({fed}), {load}: fits on one node fewer"
        if starved:
            return "hold", f"trainer starved ({starved}) but nodes have free slots ({load})"
        return "hold", f"trainer fed, {load}"

    def _trainer(self, f: Figures) -> tuple[str | None, str | None]:
        """(why the trainer is starved, "" when it is not; why it is fed, None when it is not).
        Starved by any target, fed by all; between the two a target is in its hysteresis band.
        A target whose figure is missing (no batch served yet) makes both None: no call."""
        cfg = self.config
        starved: list[str] = []
        fed: list[str] = []
        targets = 0
        if cfg.target_trainer_idle is not None:
            if f.trainer_idle is None:
                return None, None
            targets += 1
            t, low = cfg.target_trainer_idle, cfg.target_trainer_idle * SHRINK_IDLE_SHARE
            if f.trainer_idle > t:
                starved.append(f"idle {f.trainer_idle:.2f} > {t:g}")
            elif f.trainer_idle <= low:
                fed.append(f"idle {f.trainer_idle:.2f} <= {low:g}")
        if cfg.target_buffer_fill is not None:
            if f.buffer_fill is None:
                return None, None
            targets += 1
            t = cfg.target_buffer_fill
            if f.buffer_fill < t:
                starved.append(f"buffer fill {f.buffer_fill:.2f} < {t:g}")
            else:
                fed.append(f"buffer fill {f.buffer_fill:.2f} >= {t:g}")
        if starved:
            return ", ".join(starved), None
        return "", (", ".join(fed) if len(fed) == targets else None)

    def _hold(self, f: Figures, reason: str, keep_streak: bool = False) -> Decision:
        if not keep_streak:
            self._streak = ("hold", 0)
        return Decision("hold", reason, f.pool, f.pool)

    def _change(self, f: Figures, now: float, action: Action, reason: str) -> Decision:
        self.last_change = now
        self._streak = ("hold", 0)
        cfg = self.config
        if f.pool < cfg.min_nodes or f.pool > cfg.max_nodes:
            target = min(max(f.pool, cfg.min_nodes), cfg.max_nodes)
        elif action == "grow":
            d = self.demand(f)
            more = max(1, d.nodes - f.pool) if d is not None else self._grow_by(f)
            target = min(cfg.max_nodes, f.pool + more)
        else:
            target = f.pool - 1
            self._surplus_since = now  # the next shrink needs a surplus of its own
        return Decision(action, reason, f.pool, target)

    def _grow_by(self, f: Figures) -> int:
        """Nodes to add: as many as the shortfall says, at least one. A trainer busy ``1 - idle``
        of the time wants ``(1 - target) / (1 - idle)`` times the pool; a buffer filled to
        ``fill`` wants ``target / fill`` times it; the larger wins. A pool that grows one node
        per cooldown would take minutes to meet a load that jumps tenfold; the estimate is
        rough, but shrinking corrects an overshoot one node at a time."""
        cfg = self.config
        factor = 1.0
        if cfg.target_trainer_idle is not None and f.trainer_idle is not None:
            busy = max(1.0 - f.trainer_idle, 1e-3)
            factor = max(factor, (1.0 - cfg.target_trainer_idle) / busy)
        if cfg.target_buffer_fill is not None and f.buffer_fill is not None:
            factor = max(factor, cfg.target_buffer_fill / max(f.buffer_fill, 1e-3))
        return max(1, math.ceil(max(f.pool, 1) * factor - 1e-9) - f.pool)


def figures(
    st: DataflowStatus,
    *,
    pool: set[str],
    draining: set[str],
    groups_per_node: int,
) -> Figures:
    """The decision's figures from a status document. ``pool``: the names of the launcher's live
    nodes that are not draining (one not active in the status yet is *starting*); ``draining``:
    those it asked to leave, which hold slots only until they deregister. Any other active node
    (one an operator joined) counts as capacity only while it takes work (holds leases or has
    pushed episodes lately): a node token can register nodes that never lease, and 30 such fakes
    counted as 30 nodes of free slots held the pool at one node while the trainer starved
    (issue 48, #7). The launcher's own nodes count once active, by name, so a fake cannot add
    more than the pool's size by taking their names. The trainer figures are the most starved
    trainable policy's still training (the one that sets the pace)."""
    active = {n.name for n in st.nodes if n.state == "active"}
    working = {
        n.name
        for n in st.nodes
        if n.state == "active" and (n.active_leases > 0 or n.episodes_per_s > 0)
    }
    nodes = len(((active & pool) | working) - draining)
    idles = [p.trainer_idle for p in st.policies.values() if p.trainer_idle is not None]
    fills = [
        (p.buffer_groups + st.training_in_flight) / p.cap_groups
        for p in st.policies.values()
        if p.trainable and p.cap_groups and p.steps < p.max_steps
    ]
    training = [p for p in st.policies.values() if p.trainable and p.steps < p.max_steps]
    return Figures(
        pool=len(pool),
        starting=len(pool - active),
        draining=len(draining),
        nodes=nodes,
        groups_per_node=groups_per_node,
        in_flight=st.training_in_flight,
        trainer_idle=max(idles) if idles else None,
        buffer_fill=round(min(fills), 4) if fills else None,
        training_done=st.training_done,
        tasks_done=st.tasks_done,
        buffered=sum(p.buffer_groups for p in training),
    )


def groups_per_node(concurrency: int, group_size: int) -> int:
    """Groups one node runs at once: it asks only while a whole group fits its free slots, and
    runs a group larger than itself alone."""
    return max(1, concurrency // group_size)
