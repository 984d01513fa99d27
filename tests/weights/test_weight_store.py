"""Weight store on disk: atomic versions, deltas from the previous version, gc, directory client."""

from __future__ import annotations

import json

import pytest
import torch

from astraflow.weights import (
    SparseDelta,
    WeightClient,
    WeightStore,
    WeightStoreError,
    WeightTransferError,
    state_digest,
)


def _states(n, dtype=torch.bfloat16, frac=0.05):
    """``n`` versions; each changes a random ``frac`` of the elements (a sparse update)."""
    g = torch.Generator().manual_seed(0)
    state = {
        "a": torch.randn(40, 30, generator=g).to(dtype),
        "b": torch.randn(30, generator=g).to(dtype),
    }
    out = [state]
    for _ in range(n - 1):
        state = {k: v.clone() for k, v in state.items()}
        for v in state.values():
            hit = torch.rand(v.shape, generator=g) < frac
            v[hit] = torch.randn(int(hit.sum()), generator=g).to(dtype)
        out.append(state)
    return out


def _assert_bits(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k].view(-1).view(torch.uint8), b[k].view(-1).view(torch.uint8))


def test_publish_writes_snapshot_delta_and_meta(tmp_path):
    store = WeightStore(tmp_path)
    s0, s1 = _states(2)
    v0 = store.publish("solver", 0, s0)
    v1 = store.publish("solver", 1, s1)
    assert v0.parent is None and v0.delta_bytes is None
    assert v1.parent == 0 and 0 < v1.delta_bytes
    assert v1.digest == state_digest(s1)
    assert store.versions("solver") == [0, 1]
    assert store.latest("solver").version == 1
    files = sorted(p.name for p in (tmp_path / "solver" / "v1").iterdir())
    assert files == ["delta_from_0.safetensors", "meta.json", "model.safetensors"]
    assert not [p for p in (tmp_path / "solver").iterdir() if p.name.startswith(".")]
    delta = SparseDelta.from_bytes(store.read_delta("solver", 1))
    target = {k: v.clone() for k, v in s0.items()}
    delta.apply_(target)
    _assert_bits(target, s1)
    assert store.read_delta("solver", 0) is None


def test_publishing_live_tensors_updated_in_place(tmp_path):
    """A trainer publishes its parameters, then the optimizer mutates them in place."""
    store = WeightStore(tmp_path)
    param = torch.zeros(100)
    store.publish("p", 0, {"w": param})
    param[7] = 1.0
    v1 = store.publish("p", 1, {"w": param})
    delta = SparseDelta.from_bytes(store.read_delta("p", 1))
    assert delta.tensors["w"].indices.tolist() == [7]
    assert v1.digest == state_digest({"w": param})


def test_fresh_store_object_computes_delta_from_disk(tmp_path):
    s0, s1 = _states(2)
    WeightStore(tmp_path).publish("p", 0, s0)
    v1 = WeightStore(tmp_path).publish("p", 1, s1)
    assert v1.parent == 0


def test_publish_rejects_old_versions_and_bad_names(tmp_path):
    store = WeightStore(tmp_path)
    s0, s1 = _states(2)
    store.publish("p", 3, s0)
    with pytest.raises(WeightStoreError, match="higher version"):
        store.publish("p", 3, s1)
    assert store.publish("p", 3, s0).version == 3  # same contents: an idempotent retry
    with pytest.raises(WeightStoreError, match="invalid policy"):
        store.publish("../evil", 0, s0)
    with pytest.raises(WeightStoreError, match="no version"):
        store.read_full("p", 7)


def test_gc_keeps_the_newest_versions(tmp_path):
    store = WeightStore(tmp_path)
    for v, s in enumerate(_states(5)):
        store.publish("p", v, s)
    assert store.gc("p", keep=2) == [0, 1, 2]
    assert store.versions("p") == [3, 4]
    assert store.gc("p", keep=2) == []
    with pytest.raises(WeightStoreError, match="at least 1"):
        store.gc("p", keep=0)


def test_discard_from_lets_a_restarted_trainer_republish(tmp_path):
    store = WeightStore(tmp_path)
    states = _states(4)
    for v, s in enumerate(states[:3]):
        store.publish("p", v, s)
    assert store.discard_from("p", 2) == [2]
    v2 = store.publish("p", 2, states[3])
    assert v2.parent == 1 and v2.digest == state_digest(states[3])
    held = {k: v.clone() for k, v in states[1].items()}
    SparseDelta.from_bytes(store.read_delta("p", 2)).apply_(held)
    _assert_bits(held, states[3])


def test_directory_client_uses_delta_chain_when_close_else_full(tmp_path):
    store = WeightStore(tmp_path)
    states = _states(7)
    for v, s in enumerate(states):
        store.publish("p", v, s)
    client = WeightClient(tmp_path, max_chain=3)

    upd = client.fetch_update("p", have_version=4, have_digest=state_digest(states[4]))
    assert upd.version == 6 and upd.full is None and upd.parent == 4
    held = {k: v.clone() for k, v in states[4].items()}
    upd.delta.apply_(held)
    _assert_bits(held, states[6])

    far = client.fetch_update("p", have_version=1, have_digest=state_digest(states[1]))
    assert far.delta is None and far.full is not None
    _assert_bits(far.full, states[6])

    # a node whose state is not the store's v5 (e.g. other run) gets the full snapshot
    wrong = client.fetch_update("p", have_version=5, have_digest="sha256:00")
    assert wrong.full is not None

    # without a digest the node is trusted; apply_ still checks the parent
    trusted = client.fetch_update("p", have_version=5)
    assert trusted.delta is not None and trusted.delta.parent_digest == state_digest(states[5])

    assert client.fetch_update("p", have_version=6, have_digest=state_digest(states[6])) is None
    assert client.fetch_update("other", None, None) is None

    store.gc("p", keep=2)  # v4's successors 5,6 remain, so the chain still works
    assert client.fetch_update("p", 4, state_digest(states[4])).delta is not None
    store.gc("p", keep=1)  # v5 gone: fall back to full
    assert client.fetch_update("p", 4, state_digest(states[4])).full is not None


def test_client_takes_the_snapshot_when_deltas_are_not_smaller(tmp_path):
    store = WeightStore(tmp_path)
    states = _states(3, frac=0.9)  # nearly every element changes: deltas ~ dense
    for v, s in enumerate(states):
        store.publish("p", v, s)
    upd = WeightClient(tmp_path).fetch_update("p", 0, state_digest(states[0]))
    assert upd.full is not None and upd.delta is None
    _assert_bits(upd.full, states[2])


def test_directory_client_rejects_corrupted_and_truncated_files(tmp_path):
    store = WeightStore(tmp_path)
    s0, s1 = _states(2)
    store.publish("p", 0, s0)
    store.publish("p", 1, s1)
    client = WeightClient(tmp_path)
    full = tmp_path / "p" / "v1" / "model.safetensors"
    data = full.read_bytes()
    full.write_bytes(data[:-10])
    with pytest.raises(WeightTransferError, match="truncated"):
        client.fetch_update("p", None, None)
    corrupt = bytearray(data)
    corrupt[-5] ^= 0x01
    full.write_bytes(bytes(corrupt))
    with pytest.raises(WeightTransferError, match="corrupt"):
        client.fetch_update("p", None, None)
    delta = tmp_path / "p" / "v1" / "delta_from_0.safetensors"
    delta.write_bytes(delta.read_bytes()[:-1])
    with pytest.raises(WeightTransferError, match="truncated"):
        client.fetch_update("p", 0, state_digest(s0))


def test_meta_announces_digest_and_sizes(tmp_path):
    store = WeightStore(tmp_path, location="http://trainer:1234")
    (s0,) = _states(1)
    wv = store.publish("p", 0, s0)
    meta = json.loads((tmp_path / "p" / "v0" / "meta.json").read_text())
    assert meta["full_bytes"] == (tmp_path / "p" / "v0" / "model.safetensors").stat().st_size
    assert wv.location == "http://trainer:1234" and wv.full_bytes == meta["full_bytes"]


def test_unknown_source_is_a_clear_error(tmp_path):
    with pytest.raises(WeightStoreError, match="neither an http"):
        WeightClient(tmp_path / "missing")


def test_a_restarted_trainer_announces_its_checkpoint_version_at_its_new_address(tmp_path):
    states = _states(2)
    WeightStore(tmp_path, location="http://127.0.0.1:1111").publish("solver", 1, states[1])
    # the trainer restarts from checkpoint-1 behind a new weight server and publishes v1 again
    again = WeightStore(tmp_path, location="http://127.0.0.1:2222").publish("solver", 1, states[1])
    assert again.version == 1 and again.location == "http://127.0.0.1:2222"
