"""run_dir/metrics.jsonl, written by the dataflow service alone (one line per step and eval).

Records are first inserted into the store inside the transaction that acknowledges the step, then
appended to the file after the commit. Each line carries the record's ``seq``; on startup the
service appends the records the file is missing, so a crash between commit and append loses no
line and duplicates none.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

from astraflow.dataflow import storage
from astraflow.dataflow.storage.store import Tx


class MetricsLog:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._last_seq = self._last_seq_in_file()

    def _last_seq_in_file(self) -> int:
        if not self.path.exists():
            return 0
        last = 0
        with self.path.open("rb") as f:
            for line in f:
                try:
                    last = max(last, int(json.loads(line).get("seq", 0)))
                except (ValueError, AttributeError):
                    continue
        return last

    def record(self, tx: Tx, record: dict) -> None:
        """Store ``record`` in this transaction; it reaches the file after the commit."""
        seq = storage.metric_records.insert(tx, json.dumps(record))
        line = json.dumps({"seq": seq, **record}, sort_keys=False)
        tx.after_commit.append(lambda: self._append(seq, line))

    def _append(self, seq: int, line: str) -> None:
        with self._lock:
            if seq <= self._last_seq:
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(line + "\n")
            self._last_seq = seq

    def forget(self, tx: Tx, matches: Callable[[dict], bool]) -> int:
        """Delete the records ``matches`` selects (a rewound timeline's steps and evaluations);
        after the commit the file is rewritten from the store, atomically. Returns how many."""
        doomed = [
            seq
            for seq, body in storage.metric_records.all_unordered(tx)
            if matches(json.loads(body))
        ]
        if not doomed:
            return 0
        storage.metric_records.delete(tx, doomed)
        rows = storage.metric_records.all_in_order(tx)
        tx.after_commit.append(lambda: self._rewrite(rows))
        return len(doomed)

    def _rewrite(self, rows: list[tuple[int, str]]) -> None:
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(self.path.name + ".tmp")
            with tmp.open("w", encoding="utf-8") as f:
                for seq, body in rows:
                    f.write(json.dumps({"seq": seq, **json.loads(body)}) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            self._last_seq = max([self._last_seq, *(seq for seq, _ in rows)])

    def recover(self, tx: Tx) -> int:
        """Append committed records missing from the file; returns how many were written."""
        rows = storage.metric_records.after(tx, self._last_seq)
        for seq, body in rows:
            self._append(seq, json.dumps({"seq": seq, **json.loads(body)}))
        return len(rows)
