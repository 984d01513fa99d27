"""Canonical digest of a model state: the identity every weight version is checked against.

Each tensor is hashed on its own (sha256 of its name, dtype, shape and raw little-endian bytes) and
the state's digest is the sha256 of those per-tensor digests in sorted name order. Two states have
the same digest exactly when they are bit-for-bit equal, so a node that applied a delta can prove it
holds the trainer's weights. Hashing per tensor lets the large tensors hash on several cores at once
(hashlib releases the GIL), which matters because the digest is computed on every publish and
twice on every verified delta application.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

DIGEST_PREFIX = "sha256:"
#: Tensors below this many bytes are hashed inline (a thread hop costs more than the hash).
_PARALLEL_MIN_BYTES = 1 << 20


def tensor_bytes(tensor: Any) -> memoryview:
    """Raw bytes of a tensor (moved to CPU and made contiguous when needed)."""
    import torch

    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1)
    return memoryview(t.view(torch.uint8).numpy())


def tensor_digest(name: str, tensor: Any) -> bytes:
    """sha256 (raw 32 bytes) of one named tensor: name, dtype, shape, then its bytes."""
    header = f"{name}\0{str(tensor.dtype).removeprefix('torch.')}\0{tuple(tensor.shape)}\0"
    h = hashlib.sha256()
    h.update(len(header).to_bytes(8, "little"))
    h.update(header.encode())
    h.update(tensor_bytes(tensor))
    return h.digest()


def state_digest(tensors: Mapping[str, Any], workers: int | None = None) -> str:
    """``sha256:<hex>`` of a name -> tensor mapping (see the module docstring)."""
    names = sorted(tensors)
    big = [
        n for n in names if tensors[n].numel() * tensors[n].element_size() >= _PARALLEL_MIN_BYTES
    ]
    workers = workers or min(4, os.cpu_count() or 1)
    digests: dict[str, bytes] = {}
    if len(big) > 1 and workers > 1:
        with ThreadPoolExecutor(workers) as pool:
            for n, d in zip(
                big, pool.map(lambda n: tensor_digest(n, tensors[n]), big), strict=True
            ):
                digests[n] = d
    h = hashlib.sha256()
    for n in names:
        h.update(digests.get(n) or tensor_digest(n, tensors[n]))
    return DIGEST_PREFIX + h.hexdigest()


def bytes_digest(data: bytes | memoryview) -> str:
    """``sha256:<hex>`` of a byte string (a file as transferred)."""
    return DIGEST_PREFIX + hashlib.sha256(data).hexdigest()
