"""Share what the main trainer process pulled with the other ranks, as msgpack bytes.

Why not ``accelerate.utils.broadcast_object_list``: it pickles, and unpickling is code execution;
nothing in AstraFlow is pickled on the wire, between the ranks of one trainer included. The batch is
a protocol model with a codec already, so every rank decodes exactly the bytes the dataflow sent, at
the cost of two broadcasts (length, then bytes) instead of one.
"""

from __future__ import annotations

import torch

from astraflow.protocol.ranks import RankPayload


def share_from_main(payload: RankPayload | None, *, device: torch.device | str) -> RankPayload:
    """Broadcast rank 0's ``payload`` (None on the other ranks) and return it on every rank.

    Collective: every rank of the default process group must call it. ``device`` is where the
    backend wants its tensors (CPU for gloo, the rank's GPU for NCCL).
    """
    import torch.distributed as dist

    main = dist.get_rank() == 0
    if main and payload is None:
        raise ValueError("rank 0 must pass the payload it pulled")
    body = payload.to_bytes() if main and payload is not None else b""
    size = torch.tensor([len(body)], dtype=torch.int64, device=device)
    dist.broadcast(size, src=0)
    if main:
        data = torch.frombuffer(bytearray(body), dtype=torch.uint8).to(device)
    else:
        data = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    dist.broadcast(data, src=0)
    if main and payload is not None:
        return payload
    return RankPayload.from_bytes(data.cpu().numpy().tobytes())
