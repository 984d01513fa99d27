"""Making a sandbox backend in tests: skip when it is unavailable, except where it must run.

CI starts a Docker engine and builds the sandbox image, then sets ``ASTRAFLOW_REQUIRE_DOCKER=1``
(``.ci/run``): there a missing docker backend fails the test instead of skipping it, so the
Docker kill paths are exercised wherever an engine answers rather than skipped unnoticed.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from astraflow.envs.sandbox import SandboxError, make_backend

REQUIRE_DOCKER = "ASTRAFLOW_REQUIRE_DOCKER"


def backend_or_skip(name: str, make: Callable[[str], object] = make_backend):
    """``make(name)``, or a skip naming why the backend is unavailable (a failure for docker
    when ``ASTRAFLOW_REQUIRE_DOCKER`` is set)."""
    try:
        return make(name)
    except SandboxError as exc:
        if name == "docker" and os.environ.get(REQUIRE_DOCKER):
            pytest.fail(f"{REQUIRE_DOCKER} is set but the docker sandbox is unavailable: {exc}")
        pytest.skip(f"{name} sandbox unavailable here: {exc}")
