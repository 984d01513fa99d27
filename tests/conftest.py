"""Shared fixtures. Tests that need the real data files use ``shared_data`` (skips when absent)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import psutil
import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT / ".." / "shared" / "data"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``shared/data`` beside the repository root (real datasets, read-only)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data directory {SHARED_DATA.resolve()} is absent (see its README)")
    return SHARED_DATA.resolve()


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture(scope="session")
def still_running() -> Callable[[Mapping[str, int]], list[str]]:
    """The names in a ``{name: pid}`` map (a run's ``pids.json``) whose process still runs; a
    zombie does not count. What a test that stops a run checks is empty."""
    return lambda pids: [name for name, pid in pids.items() if pid and _running(pid)]
