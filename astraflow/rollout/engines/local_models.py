"""A policy's model -> the local checkpoint directory an engine loads, never downloading.

Why: ``policies.NAME.model`` may be a Hugging Face id (``Qwen/Qwen3-0.6B``), but the transformers
and vLLM engines load a directory. A node used to hand the id on unchanged, and the engine refused
it ("not a checkpoint directory") after the run had started. The id is now looked up in the local
Hugging Face cache, by ``astraflow recipe check`` (:mod:`astraflow.recipe.preflight`) before anything
starts and by :func:`~astraflow.rollout.engines.make_engine` on each node, with the same answer; a
model that is not there is refused with the command that fetches it. Nothing here downloads: a
multi-gigabyte fetch inside a rollout node's start-up would look like a hang, and on a multi-host
run each host would fetch its own copy unasked.

Imports only the standard library at module level (``huggingface_hub`` when an id is looked up).
"""

from __future__ import annotations

from pathlib import Path

from astraflow.errors import AstraFlowError

#: The weight files a checkpoint directory may hold (one of them, or a sharded index, must be there).
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.safetensors.index.json")


class ModelNotCached(AstraFlowError, FileNotFoundError):
    """A policy's model is neither a local checkpoint nor complete in the local HF cache; the
    message says what to do (the download command, or a local path)."""


def looks_like_hub_id(model: str) -> bool:
    """``org/name`` (or a bare ``name``) that is not an existing path and not a path spelling."""
    if not model or Path(model).expanduser().exists():
        return False
    if model.startswith(("/", "./", "../", "~")) or "\\" in model or ":" in model:
        return False
    return model.count("/") <= 1


def has_weights(directory: Path) -> bool:
    return any(any(directory.glob(pattern)) for pattern in WEIGHT_PATTERNS)


def cached_snapshot(repo_id: str, cache_dir: str | Path | None = None) -> Path | None:
    """The snapshot directory of ``repo_id`` in the local HF cache (``$HF_HUB_CACHE``), or None
    when its ``config.json`` is not there. Reads the cache only: no network."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, "config.json", cache_dir=cache_dir)
    except ValueError:  # not a valid repo id
        return None
    if not isinstance(found, str):  # None, or the "known not to exist" marker
        return None
    return Path(found).parent


def download_hint(repo_id: str) -> str:
    """What to do about a hub id missing from the cache: ``hf`` is huggingface_hub's command
    since 0.34 (1.0 dropped ``huggingface-cli``), the older name is given for older installs."""
    return (
        f"download it first with `hf download {repo_id}` (older huggingface_hub: "
        f"`huggingface-cli download {repo_id}`; HF_HOME or HF_HUB_CACHE choose the cache), or "
        "set the policy's model to a local checkpoint directory"
    )


def local_checkpoint(model: str, cache_dir: str | Path | None = None) -> str:
    """``model`` as a directory an engine loads: ``builtin:NAME`` -> its path, a local path (a
    checkpoint, or a run directory -> its latest checkpoint) as resolved by
    :func:`astraflow.models.loading.resolve_checkpoint`, a hub id -> its snapshot in the local HF
    cache. Raises :class:`ModelNotCached` (with what to do) when there is none."""
    from astraflow.models.loading import resolve_checkpoint

    path = Path(model).expanduser()
    if model.startswith("builtin:") or path.is_dir():
        return resolve_checkpoint(model)
    if not looks_like_hub_id(model):
        raise ModelNotCached(
            f"model {model!r}: no such local path; set the policy's model to an existing "
            "checkpoint directory (holding config.json), a Hugging Face id or builtin:NAME"
        )
    snapshot = cached_snapshot(model, cache_dir)
    if snapshot is None:
        raise ModelNotCached(
            f"model {model!r} is not in the local Hugging Face cache; {download_hint(model)}"
        )
    if not has_weights(snapshot):
        raise ModelNotCached(
            f"model {model!r} is in the local Hugging Face cache ({snapshot}) without its weights "
            f"(an interrupted or config-only download); {download_hint(model)}"
        )
    return str(snapshot)
