"""Apply a :class:`WeightUpdate` (full state or sparse delta) to a name -> tensor mapping in place.

Shared by the engines that hold weights in this process (the transformers engine's live model, the
vLLM engine's CPU copy that it snapshots for the server). In place, because a model's parameters are
referenced by its modules: replacing the tensors would silently leave the model on the old weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from astraflow.errors import AstraFlowError
from astraflow.rollout.engines.base import WeightUpdate
from astraflow.weights.delta import DeltaChain, SparseDelta


class WeightUpdateError(AstraFlowError, ValueError):
    """An update that does not fit the engine's weights (names, shapes, parent version)."""


def check_update(update: WeightUpdate, current_version: int) -> None:
    """Reject an update that is malformed or does not follow the weights currently loaded."""
    if (update.full is None) == (update.delta is None):
        raise WeightUpdateError(
            f"WeightUpdate for version {update.version} must carry exactly one of `full` "
            f"(name -> tensor) or `delta` (a SparseDelta); got "
            f"full={'set' if update.full is not None else 'None'}, "
            f"delta={'set' if update.delta is not None else 'None'}"
        )
    if update.delta is not None:
        if not callable(getattr(update.delta, "apply_", None)):
            raise WeightUpdateError(
                f"WeightUpdate.delta must have an `apply_(tensors)` method (astraflow.weights."
                f"SparseDelta); got {type(update.delta).__name__}"
            )
        if update.parent is not None and update.parent != current_version:
            raise WeightUpdateError(
                f"delta to version {update.version} applies on top of version {update.parent}, "
                f"but the engine holds version {current_version}; fetch the full snapshot instead"
            )


def apply_update_(
    state: Mapping[str, torch.Tensor], update: WeightUpdate, state_digest: str | None = None
) -> str | None:
    """Write ``update`` into the tensors of ``state`` in place (call :func:`check_update` first).

    ``state_digest`` is the digest of ``state`` as this function last returned it (None when
    unknown). Returns the digest of the state after the update when the update verified it (an
    astraflow delta checks its result), else None. Passing it back on the next call spares
    re-hashing the whole state before the next delta; the delta's result check still runs.
    """
    if update.delta is not None:
        if state_digest is not None and isinstance(update.delta, (SparseDelta, DeltaChain)):
            update.delta.apply_(state, parent_digest=state_digest)
        else:
            update.delta.apply_(state)
        return update.delta.digest if isinstance(update.delta, (SparseDelta, DeltaChain)) else None
    full: Mapping[str, Any] = update.full or {}
    unknown = sorted(set(full) - set(state))
    if unknown:
        raise WeightUpdateError(
            f"full update for version {update.version} names tensors the model does not have: "
            f"{unknown[:5]}{' ...' if len(unknown) > 5 else ''} (expected names from the model's "
            f"state_dict, e.g. {sorted(state)[:3]})"
        )
    provided_storage = {state[name].data_ptr() for name in full}
    missing = sorted(
        name
        for name in state
        if name not in full and state[name].data_ptr() not in provided_storage
    )
    if missing:
        raise WeightUpdateError(
            f"full update for version {update.version} lacks tensors {missing[:5]}"
            f"{' ...' if len(missing) > 5 else ''}; a full update must cover the whole state_dict"
        )
    for name, value in full.items():
        target = state[name]
        source = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
        if tuple(source.shape) != tuple(target.shape):
            raise WeightUpdateError(
                f"tensor {name!r} in the update for version {update.version} has shape "
                f"{tuple(source.shape)}, the model expects {tuple(target.shape)}"
            )
    with torch.no_grad():
        for name, value in full.items():
            source = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
            state[name].copy_(source)
    return None  # a copy may cast dtypes: the state's digest is not known without hashing it
