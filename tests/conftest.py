"""Shared fixtures. Tests that need the real data files use ``shared_data`` (skips when absent)."""

from __future__ import annotations

from pathlib import Path

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
