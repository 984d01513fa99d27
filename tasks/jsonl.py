"""The ``jsonl`` task set: any JSON-lines file whose rows are task payloads, as they are.

Why: a plugin env (or a built-in one with a new dataset) needs no loader code of its own; each row
is handed to the env's ``reset(options={"task": row})`` unchanged. Every payload gets an ``id``:
the row's ``id_field`` when given (default ``id``), else its row number, so task ids stay stable
across runs and restarts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from astraflow.tasks.base import Payload

SPLITS = ("train", "test", "validation")


def load_jsonl(
    split: str,
    seed: int = 0,
    *,
    path: str | None = None,
    id_field: str = "id",
) -> list[Payload]:
    """Rows of ``path`` (``{split}`` in it is replaced by the split name, so one recipe entry
    per split can share a pattern such as ``data/{split}.jsonl``)."""
    del seed  # a file's order is its own; the dataflow service shuffles later epochs
    if not path:
        raise ValueError(
            "task set 'jsonl' needs kwargs.path: a JSON-lines file of task payloads, "
            "e.g. kwargs = { path = 'tasks.jsonl' } (may contain {split})"
        )
    if "{split}" not in str(path) and split != "train":
        # One file is one split: serving it as 'test' too would evaluate on the training data
        # (the default evaluation asks for split 'test' of the first training set).
        raise ValueError(
            f"task set 'jsonl' has one file ({path}) and no '{{split}}' in kwargs.path, so split "
            f"{split!r} would be the training data; put {{split}} in the path "
            "(e.g. data/{split}.jsonl), point evaluation.task_set at a held-out set, or set "
            "evaluation.every_steps = 0"
        )
    target = Path(str(path).replace("{split}", split)).expanduser()
    if not target.is_file():
        raise FileNotFoundError(f"task set 'jsonl' (split {split!r}): file not found: {target}")
    rows: list[Payload] = []
    with target.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row: Any = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{target}:{lineno}: not valid JSON: {exc.msg}") from None
            if not isinstance(row, dict):
                raise ValueError(
                    f"{target}:{lineno}: each row must be a JSON object (a task payload), "
                    f"got {type(row).__name__}"
                )
            payload = dict(row)
            if id_field in row:
                payload["id"] = str(row[id_field])
            else:
                payload["id"] = str(len(rows))
            rows.append(payload)
    return rows
