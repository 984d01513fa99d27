"""What a node receives to move its engine to a new weight version.

Same fields as ``astraflow.rollout.engines.base.WeightUpdate`` (which re-exports this class); it lives
here because ``astraflow.weights`` must not import the rollout component.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class WeightUpdate:
    """A full state (name -> tensor) or a delta from ``parent`` (``delta.apply_(tensors)``).

    ``delta`` is a :class:`~astraflow.weights.delta.SparseDelta` or a
    :class:`~astraflow.weights.delta.DeltaChain`; both check ``digest`` after applying.
    """

    version: int
    full: dict[str, Any] | None = None
    delta: Any | None = None
    parent: int | None = None
    digest: str | None = None
