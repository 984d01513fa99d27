"""The cheap paths of a node's weight sync stay safe: a known parent digest replaces re-hashing
but is still checked, and a delta update over HTTP costs one metadata round trip, not two."""

from __future__ import annotations

import httpx
import pytest
import torch

from astraflow.rollout.engines.base import WeightUpdate
from astraflow.rollout.engines.weight_apply import apply_update_
from astraflow.weights import DeltaError, SparseDelta, WeightClient, WeightStore, state_digest
from astraflow.weights.server import create_weight_app, serve_in_thread

TOKEN = "t0ken-for-tests"


def _states(n: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    # bf16 weights and a small step: most elements keep their bits, so deltas are sparse (and
    # smaller than a snapshot, which is when a node fetches them)
    states = [{"w": torch.randn(64, 32, generator=g).to(torch.bfloat16), "b": torch.zeros(5)}]
    for _ in range(n - 1):
        prev = states[-1]
        step = 1e-3 * torch.randn(64, 32, generator=g)
        states.append({"w": (prev["w"].float() + step).to(torch.bfloat16), "b": prev["b"]})
    return states


def _clone(state):
    return {k: v.clone() for k, v in state.items()}


def test_known_parent_digest_is_checked_not_trusted_blindly():
    s0, s1 = _states(2)
    delta = SparseDelta.compute(s0, s1)
    live = _clone(s0)
    with pytest.raises(DeltaError, match="delta applies to state"):
        delta.apply_(live, parent_digest="sha256:" + "0" * 64)
    assert torch.equal(live["w"], s0["w"])  # rejected before anything was written
    delta.apply_(live, parent_digest=state_digest(s0))
    assert torch.equal(live["w"], s1["w"])


def test_apply_update_hands_back_the_verified_digest_for_the_next_delta():
    s0, s1, s2 = _states(3)
    live = _clone(s0)
    full = apply_update_(live, WeightUpdate(version=0, full=_clone(s0)))
    assert full is None  # a full copy may cast: its digest is not known without hashing
    d1 = SparseDelta.compute(s0, s1)
    known = apply_update_(live, WeightUpdate(version=1, delta=d1, parent=0), full)
    assert known == state_digest(s1) == d1.digest
    d2 = SparseDelta.compute(s1, s2)
    assert apply_update_(live, WeightUpdate(version=2, delta=d2, parent=1), known) == d2.digest
    assert torch.equal(live["w"], s2["w"])
    # The result is still verified: a state that is not what its "known" digest claims (here a
    # tensor the delta does not touch differs) cannot slip through.
    drifted = _clone(s1)
    drifted["b"] += 1
    with pytest.raises(DeltaError, match="state after applying"):
        apply_update_(drifted, WeightUpdate(version=2, delta=d2, parent=1), d1.digest)


def test_one_step_delta_fetch_reads_the_target_meta_once(tmp_path):
    store = WeightStore(tmp_path)
    states = _states(3)
    for v, s in enumerate(states):
        store.publish("solver", v, s)
    url, stop = serve_in_thread(create_weight_app(store, TOKEN))
    paths: list[str] = []
    try:
        with WeightClient(url, TOKEN) as client:
            client.backend._http.event_hooks["request"] = [lambda req: paths.append(req.url.path)]
            update = client.fetch_update("solver", have_version=1, want_version=2)
            assert update is not None and update.delta is not None
            assert paths == ["/weights/solver/2/meta", "/weights/solver/2/delta"]
            live = _clone(states[1])
            update.delta.apply_(live)
            assert torch.equal(live["w"], states[2]["w"])
            # Ranged reads of the large-chunk file response still resume mid-file.
            resp = httpx.get(
                f"{url}/weights/solver/2/full",
                headers={"Authorization": f"Bearer {TOKEN}", "Range": "bytes=10-"},
            )
            assert resp.status_code == 206
            assert resp.content == store.read_full("solver", 2)[10:]
    finally:
        stop()
