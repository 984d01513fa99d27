"""Fixtures of the trainer tests: the built-in tiny policy (rollout helpers: trainer_rollouts.py)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def tiny_model_path() -> str:
    from astraflow.models import resolve_model

    try:
        return resolve_model("builtin:tiny-arith")
    except FileNotFoundError as exc:  # pragma: no cover - the checkpoint is committed
        pytest.skip(f"built-in tiny model missing: {exc}")


@pytest.fixture(scope="session")
def tiny_policy(tiny_model_path):
    """(model, tokenizer) of the tiny policy, loaded once, for producing rollouts."""
    from transformers import AutoModelForCausalLM

    from astraflow.models import load_tokenizer

    torch.set_num_threads(1)
    tok = load_tokenizer(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    return model, tok
