"""Where a bench's figures came from: the stamp every ``--json`` file carries, and the one writer.

``docs/results.md`` is generated from these files (``python bench/results.py``), and each of
its tables says which commit, date, machine and command produced it, read from ``meta``. The
stamp is taken when the file is written, so a figure can never be older than the code it names
without the file saying so (``dirty: true`` when the tree had uncommitted changes).

Standard library only: the lightest benches import it without the harness.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def machine() -> dict[str, Any]:
    """What the figures were measured on: CPU count and model, memory, accelerator, versions."""
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["memory_gib"] = round(int(line.split()[1]) / 2**20, 1)
                break
    except OSError:
        pass
    try:
        import torch

        info["torch"] = torch.__version__
        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        info["gpu"] = None
    return info


def stamp(argv: list[str] | None = None) -> dict[str, Any]:
    """The ``meta`` block: bench, command, commit (and whether the tree was dirty), date, machine."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0]).name if argv else "?"
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "bench": Path(script).stem,
        "command": " ".join(["python", f"bench/{script}", *argv[1:]]),
        "commit": _git("rev-parse", "HEAD"),
        "dirty": bool(status) if status is not None else None,
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine(),
    }


def write_json(path: Path | str, payload: dict[str, Any], *, default=None) -> Path:
    """Write a bench's results with its ``meta`` stamp (kept when the payload already has one,
    e.g. a re-analysis of saved runs)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "meta": payload.get("meta") or stamp(),
        **{k: v for k, v in payload.items() if k != "meta"},
    }
    path.write_text(json.dumps(body, indent=2, default=default) + "\n", encoding="utf-8")
    return path
