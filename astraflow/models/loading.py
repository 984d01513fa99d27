"""Load a resolved model path with transformers (imports stay inside the functions: the CLI and
services import this package without paying for torch/transformers until they load a model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from astraflow.models.registry import resolve_model
from astraflow.models.tokenizer import load_tokenizer as _load_tokenizer_path


def load_tokenizer(path: str | Path):
    """Tokenizer of a model path, hub id or ``builtin:NAME`` (fast tokenizer, parts untouched)."""
    return _load_tokenizer_path(resolve_model(str(path)))


def load_model(path: str | Path, device: str = "cpu", dtype: Any = "float32"):
    """A causal LM in eval mode on ``device``; ``dtype`` is a torch dtype, its name, or "auto"
    (the checkpoint's own dtype)."""
    import torch
    from transformers import AutoModelForCausalLM

    if isinstance(dtype, str) and dtype != "auto":
        resolved = getattr(torch, dtype, None)
        if not isinstance(resolved, torch.dtype):
            raise ValueError(f"unknown dtype {dtype!r}; expected e.g. 'float32', 'bfloat16'")
        dtype = resolved
    model = AutoModelForCausalLM.from_pretrained(resolve_model(str(path)), dtype=dtype)
    return model.to(device).eval()
