"""Where real data files live: ``$ASTRAFLOW_DATA_DIR``, else the ``shared/data`` folder beside the
repository (the layout of the development machines and CI). Never inside the repository."""

from __future__ import annotations

import os
from pathlib import Path

from astraflow.errors import AstraFlowError

DATA_DIR_ENV = "ASTRAFLOW_DATA_DIR"


class DataFileMissing(AstraFlowError, FileNotFoundError):
    """A task set's file is absent; the message says where it was looked for and how to fix it."""


def data_dir() -> Path:
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV])
    return Path(__file__).resolve().parents[1].parent / "shared" / "data"


def data_file(relative: str, what: str, path: str | os.PathLike[str] | None = None) -> Path:
    """``path`` if given, else ``data_dir()/relative``; a clear error when the file is missing."""
    target = Path(path) if path is not None else data_dir() / relative
    if not target.is_file():
        how = (
            "check the path= kwarg"
            if path is not None
            else f"set {DATA_DIR_ENV} to a folder holding {relative}, or pass path=..."
        )
        raise DataFileMissing(f"{what}: file not found: {target} ({how})")
    return target
