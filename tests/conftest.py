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
