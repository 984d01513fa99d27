"""Which trainer checkpoint a restart may trust, and which batch it had just trained.

Why a marker file: Hugging Face writes ``checkpoint-N/`` file by file, so a trainer killed while
saving leaves a folder that looks like the newest checkpoint and cannot be loaded (or, worse, holds
new weights beside an old optimizer). The marker ``astraflow-step.json`` is written last, atomically,
and names the step's batch: a restart resumes from the newest *marked* checkpoint, removes newer
unmarked folders, and acknowledges that batch again (idempotent at the dataflow), because a step can
be checkpointed and killed before its acknowledgement reached the service.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("astraflow.trainer")

MARKER = "astraflow-step.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


@dataclass(frozen=True)
class CheckpointMark:
    """What a complete checkpoint records about the step that produced it."""

    version: int
    batch_id: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)


def write_mark(folder: str | Path, mark: CheckpointMark) -> None:
    """Mark ``folder`` complete (write to a temp file, fsync, rename: all or nothing)."""
    folder = Path(folder)
    tmp = folder / (MARKER + ".tmp")
    body = {"version": mark.version, "batch_id": mark.batch_id, "metrics": mark.metrics}
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(body, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / MARKER)


def read_mark(folder: str | Path) -> CheckpointMark | None:
    try:
        body = json.loads((Path(folder) / MARKER).read_text())
        return CheckpointMark(int(body["version"]), body.get("batch_id"), body.get("metrics") or {})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def newest_complete(output_dir: str | Path) -> tuple[Path, CheckpointMark] | None:
    """The newest marked checkpoint under ``output_dir``; unmarked folders newer than it are
    removed (they are interrupted saves). Checkpoints from before markers existed (no folder
    marked at all) are trusted as Hugging Face would: the newest one, with no batch to re-ack."""
    root = Path(output_dir)
    if not root.is_dir():
        return None
    folders = sorted(
        (int(m.group(1)), p)
        for p in root.iterdir()
        if p.is_dir() and (m := _CHECKPOINT.match(p.name))
    )
    if not folders:
        return None
    marked = [(step, p, mark) for step, p in folders if (mark := read_mark(p)) is not None]
    if not marked:
        step, path = folders[-1]
        return path, CheckpointMark(step)
    step, path, mark = marked[-1]
    for later, p in folders:
        if later > step:
            log.warning("removing %s: its save was interrupted (no %s)", p, MARKER)
            shutil.rmtree(p, ignore_errors=True)
    return path, mark
