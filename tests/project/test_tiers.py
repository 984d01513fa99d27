"""The three test tiers (tests/conftest.py): a fast test cannot start a whole run, nightly tests stay
out of a plain run and out of CI, and CI runs the fast tier, then the slow one, each with its
slowest tests listed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_a_fast_test_cannot_start_a_whole_run(tmp_path):
    # (tests/conftest.py's WholeRunOutsideSlowTier; not imported: several conftest.py files exist)
    with pytest.raises(RuntimeError, match="starts a whole run") as refused:
        subprocess.Popen(
            [sys.executable, "-m", "astraflow.cli.main", "train", "recipes/quickstart.toml"],
            cwd=REPO,
        )
    assert type(refused.value).__name__ == "WholeRunOutsideSlowTier"


def test_a_fast_test_runs_at_most_one_service_process_at_a_time(tmp_path):
    serve = [sys.executable, "-m", "astraflow.cli.main", "serve", "policy", "builtin:tiny-arith"]
    first = subprocess.Popen(
        [*serve, "--port", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        with pytest.raises(RuntimeError, match="second service process"):
            subprocess.Popen([*serve, "--port", "0"])
    finally:
        first.kill()
        first.wait(30)
    # one after the other is fine: the first has exited
    done = subprocess.run([*serve[:-2], "--help"], capture_output=True, timeout=120)
    assert done.returncode == 0


def test_nightly_tests_run_only_when_asked():
    def collected(*args: str) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", *args,
             "tests/e2e/test_autoscale.py"],
            cwd=REPO, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        return out.stdout

    assert "1 deselected" in collected()
    assert "test_pool_grows_under_load" in collected("-m", "nightly")


def test_ci_runs_the_fast_then_the_slow_tier_and_never_the_nightly_one():
    ci = (REPO / ".ci" / "run").read_text()
    fast = ci.index("bash .ci/test.sh -m fast --durations=20")
    slow = ci.index("bash .ci/test.sh -m slow --durations=20")
    assert fast < slow
    main = ci[ci.index("main() {") :]
    nightly_block = main[main.index('if [ "$tier" = "--nightly" ]') : main.index("return\n  fi")]
    for setup in ("setup_alfworld", "setup_vllm_venv", "setup_ray", "start_ray_cluster"):
        assert main.count(f"timed {setup} ") == 1 and f"timed {setup} " in nightly_block, setup
    assert "--nightly" in (REPO / ".ci" / "nightly").read_text()
