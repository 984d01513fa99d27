"""Per-policy tallies: ``drops`` (samples dropped, by reason) and ``counters`` (other things the
dataflow policies did, e.g. replayed samples).

Why one class: the two tables are the same shape (policy, key, count) and were twin code."""

from __future__ import annotations

from dataclasses import dataclass

from astraflow.dataflow.storage.store import Tx


@dataclass(frozen=True)
class Tally:
    table: str
    key: str  # the column naming what is counted

    def add(self, tx: Tx, policy: str, key: str, n: int = 1) -> None:
        if n <= 0:
            return
        tx.execute(
            f"INSERT INTO {self.table}(policy, {self.key}, count) VALUES(?,?,?) "
            f"ON CONFLICT(policy, {self.key}) DO UPDATE SET count = count + excluded.count",
            (policy, key, n),
        )

    def by_policy(self, tx: Tx) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for policy, key, n in tx.execute(f"SELECT policy, {self.key}, count FROM {self.table}"):
            out.setdefault(policy, {})[key] = n
        return out


drops = Tally("drops", "reason")
counters = Tally("counters", "name")
