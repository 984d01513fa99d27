"""Lazy task enqueue: the recipe's task sets become task rows a window at a time.

An unbounded run (``tasks.epochs = None``) cycles through its sets forever, so the service never
materialises the whole stream: it keeps about ``task_window`` pending tasks and tops the queue up on
demand. The cursor (epoch, position, emitted count per set) lives in the store, so a restarted
service continues the same deterministic stream instead of starting over.
"""

from __future__ import annotations

import random
from typing import Protocol

import msgpack

from astraflow.dataflow import storage
from astraflow.dataflow.config import ServiceConfig
from astraflow.dataflow.policies import Pipeline
from astraflow.dataflow.policies.selection import draw_set, pick_set
from astraflow.dataflow.storage.feeder import Cursor
from astraflow.dataflow.storage.store import Tx
from astraflow.protocol import Task


class TaskSource(Protocol):
    """Where task payloads come from: ``astraflow.tasks.catalog.load_task_set`` in the product, injected by
    the process entry (the dataflow does not import the task layer above it)."""

    def __call__(
        self, name: str, split: str = "train", *, seed: int = 0, limit: int | None = None, **kwargs
    ) -> list[dict]: ...


class TaskFeeder:
    """Turns task-set payloads into Task rows; used only on the store's writer thread."""

    def __init__(self, config: ServiceConfig, pipeline: Pipeline, source: TaskSource) -> None:
        self.config = config
        recipe = config.recipe
        self.source = source
        self.pipeline = pipeline
        self.sets = set_keys(recipe.tasks.sets)
        self.weights = pipeline.set_weights({k: s.weight for k, s in self.sets.items()})
        self.epochs = recipe.tasks.epochs
        self._payloads: dict[str, list[dict]] = {}
        self._orders: dict[tuple[str, int], list[int]] = {}

    def payloads(self, name: str) -> list[dict]:
        if name not in self._payloads:
            s = self.sets[name]
            items = self.source(
                s.name, s.split, seed=self.config.recipe.run.seed, limit=s.limit, **s.kwargs
            )
            if not items:
                raise ValueError(f"task set {name!r} split {s.split!r} has no tasks")
            self._payloads[name] = items
        return self._payloads[name]

    def _order(self, name: str, epoch: int) -> list[int]:
        """Epoch 0 keeps the loader's order; later epochs are seeded shuffles."""
        key = (name, epoch)
        if key not in self._orders:
            idx = list(range(len(self.payloads(name))))
            if epoch > 0:
                random.Random(f"{self.config.recipe.run.seed}:{name}:{epoch}").shuffle(idx)
            self._orders = {(s, e): v for (s, e), v in self._orders.items() if s != name}
            self._orders[key] = idx
        return self._orders[key]

    def _cursor(self, tx: Tx) -> dict[str, Cursor]:
        cur = storage.feeder.cursors(tx)
        for name in self.sets:
            cur.setdefault(name, Cursor(0, 0, 0))
        return cur

    def _available(self, cur: dict[str, Cursor]) -> list[str]:
        return [
            n
            for n in self.sets
            if self.weights.get(n, 0) > 0 and (self.epochs is None or cur[n].epoch < self.epochs)
        ]

    def exhausted(self, tx: Tx) -> bool:
        return not self._available(self._cursor(tx))

    def enqueue(self, tx: Tx, n: int, *, round_: int | None = None) -> int:
        """Insert up to ``n`` new training tasks; returns how many were inserted."""
        cur = self._cursor(tx)
        recipe = self.config.recipe
        now = self.config.clock()
        rows = []
        # adaptive weights (a curriculum) change between calls: draw in proportion to the
        # current ones, seeded by the draw's index so a restarted service draws the same way
        adaptive = self.pipeline.adaptive_weights(self.weights) if self.pipeline.adaptive else None
        for _ in range(n):
            available = self._available(cur)
            if not available:
                break
            if adaptive is None:
                name = pick_set(self.weights, {k: c.emitted for k, c in cur.items()}, available)
            else:
                drawn = sum(c.emitted for c in cur.values())
                name = draw_set(adaptive, available, f"{recipe.run.seed}:draw:{drawn}")
            epoch, pos, emitted = cur[name]
            payloads = self.payloads(name)
            payload = payloads[self._order(name, epoch)[pos]]
            split = self.sets[name].split
            pid = payload.get("id", self._order(name, epoch)[pos])
            task = Task(
                id=f"{name}:{split}:e{epoch}:{pid}",
                env=recipe.tasks.env,
                payload=payload,
                workflow=recipe.workflow.name,
                group_size=recipe.tasks.group_size,
                task_set=name,
                deadline=_deadline(payload, self.sets[name], now),
            )
            if recipe.tasks.env_kwargs:
                task.meta["env_kwargs"] = dict(recipe.tasks.env_kwargs)
            rows.append(task_row(task, now, round_=round_))
            pos += 1
            if pos >= len(payloads):
                epoch, pos = epoch + 1, 0
            cur[name] = Cursor(epoch, pos, emitted + 1)
        if rows:
            storage.tasks.insert(tx, rows)
        storage.feeder.save(tx, cur)
        return len(rows)


def _deadline(payload: dict, task_set, now: float) -> float | None:
    """Absolute deadline: the payload's own ``deadline_s`` wins over the set's ``deadline_s``."""
    rel = payload.get("deadline_s", task_set.deadline_s)
    if rel is None:
        return None
    if not isinstance(rel, (int, float)) or rel <= 0:
        raise ValueError(f"task deadline_s must be a number > 0 (seconds), got {rel!r}")
    return now + float(rel)


def set_keys(sets) -> dict:
    """Task sets by key: the set's name, or ``name[i]`` when a recipe lists one name twice
    (e.g. the same generator at two difficulty levels). Tasks carry the key as ``task_set``."""
    counts: dict[str, int] = {}
    for s in sets:
        counts[s.name] = counts.get(s.name, 0) + 1
    return {(s.name if counts[s.name] == 1 else f"{s.name}[{i}]"): s for i, s in enumerate(sets)}


def task_row(task: Task, now: float, *, round_: int | None = None) -> tuple:
    meta = task.meta
    is_eval = 1 if meta.get("eval") else 0
    body = msgpack.packb(task.model_dump(mode="json"), use_bin_type=True)
    return (
        task.id,
        body,
        task.task_set,
        task.priority,
        task.deadline,
        task.group_size,
        is_eval,
        meta.get("eval_id"),
        meta.get("policy") if is_eval else None,
        meta.get("min_version") if is_eval else None,
        round_,
        now,
    )


def load_task(body: bytes) -> Task:
    return Task.model_validate(msgpack.unpackb(body, raw=False))
