"""Weight store: full snapshots plus bit-exact sparse deltas, served over HTTP or a directory.

Trainer side: :class:`WeightStore` (``publish``, ``gc``) and :func:`create_weight_app` /
:func:`serve_in_thread`. Node side: :class:`WeightClient` (``fetch_update``) over a
:class:`WeightSource` (:class:`HTTPWeightSource`, :class:`DirectoryWeightSource`, or your own) and
``update.delta.apply_(tensors)``.
"""

from astraflow.weights.client import WeightClient, WeightTransferError, check_bytes
from astraflow.weights.delta import DeltaChain, DeltaError, SparseDelta, TensorDelta
from astraflow.weights.digest import bytes_digest, state_digest
from astraflow.weights.source import DirectoryWeightSource, HTTPWeightSource, WeightSource
from astraflow.weights.store import WeightStore, WeightStoreError
from astraflow.weights.update import WeightUpdate

__all__ = [
    "DeltaChain",
    "DeltaError",
    "DirectoryWeightSource",
    "HTTPWeightSource",
    "SparseDelta",
    "TensorDelta",
    "WeightClient",
    "WeightSource",
    "WeightStore",
    "WeightStoreError",
    "WeightTransferError",
    "WeightUpdate",
    "bytes_digest",
    "check_bytes",
    "state_digest",
]
