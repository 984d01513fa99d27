"""Fixtures of the rollout tests that start real processes."""

from __future__ import annotations

import pytest


@pytest.fixture
def procs():
    """Every process a test starts goes here and is stopped (by PID) whatever happens."""
    started = []
    yield started
    for p in reversed(started):
        p.stop()
