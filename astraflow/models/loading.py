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


def resolve_checkpoint(model: str | Path) -> str:
    """What a user names as a policy -> what an engine loads: ``builtin:NAME`` -> its path; a
    checkpoint directory (holding ``config.json``) as is; a run directory -> its latest checkpoint
    (highest number in the name, as the trainer's ``checkpoint-120`` > ``checkpoint-80``, newest
    modification time breaking ties); anything else (a Hugging Face id) unchanged, for
    transformers or vLLM to resolve."""
    import re

    model = str(model)
    path = Path(model)
    if model.startswith("builtin:") or not path.is_dir():
        return resolve_model(model)
    if (path / "config.json").is_file():
        return str(path)
    found = [p.parent for p in path.glob("**/config.json") if len(p.relative_to(path).parts) <= 4]
    if not found:
        raise FileNotFoundError(
            f"{path} is neither a checkpoint nor a run directory with checkpoints (no config.json)"
        )

    def newest(p: Path):
        nums = [int(n) for n in re.findall(r"\d+", p.name)]
        return (nums[-1] if nums else -1, p.stat().st_mtime)

    return str(max(found, key=newest))
