"""``astraflow serve policy MODEL``: one policy behind an OpenAI-compatible endpoint.

Why a command of its own: a trained policy is most useful where agent code already runs, and that
code speaks the OpenAI API. The server is :mod:`astraflow.rollout.engines.openai_server` over any
engine the rollout nodes use (``transformers`` on CPU or GPU, ``vllm``), so what is served is what
was trained: same tokenizer, same chat template, same sampling code. A checkpoint written by a
trainer carries its weight version (``astraflow-step.json``), which the server reports as
``system_fingerprint`` (``astraflow-vN``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class PolicyServerOptions:
    model: str
    api_key: str
    engine: str = "transformers"
    #: name clients pass as ``model`` (default: the MODEL argument as given)
    served_name: str | None = None
    device: str = "auto"
    torch_threads: int = 1
    engine_args: dict[str, Any] = field(default_factory=dict)
    #: how the model writes tool calls (a registered parser name, or "auto": its chat template)
    tool_parser: str = "auto"


def checkpoint_version(path: str) -> int:
    """The weight version a trainer wrote beside a checkpoint (0 for anything else)."""
    step = Path(path) / "astraflow-step.json"
    try:
        return int(json.loads(step.read_text())["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def local_model_dir(model: str) -> str:
    """A Hugging Face id -> its snapshot directory (fetched into the HF cache when missing): the
    transformers engine loads a directory. Paths are returned unchanged."""
    if Path(model).exists():
        return model
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(model)
    except Exception as exc:
        raise FileNotFoundError(
            f"{model!r} is not a local path, a run directory or builtin:NAME, and fetching it as "
            f"a Hugging Face id failed: {exc}"
        ) from None


def build_engine(opts: PolicyServerOptions):
    from astraflow.models.loading import resolve_checkpoint
    from astraflow.rollout.engines import make_engine

    args = dict(opts.engine_args)  # checked by make_engine against the kind's declared args
    if opts.engine == "openai":
        return make_engine("openai", opts.model, **args)
    path = resolve_checkpoint(opts.model)
    if opts.engine == "transformers":
        path = local_model_dir(path)
        args.setdefault("device", opts.device)
        args.setdefault("num_threads", opts.torch_threads)
    return make_engine(opts.engine, path, version=checkpoint_version(path), **args)
