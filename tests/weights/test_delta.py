"""Bit-exact sparse deltas: compute, serialise, apply, and reject what does not fit."""

from __future__ import annotations

import zlib

import pytest
import torch

from astraflow.weights import DeltaChain, DeltaError, SparseDelta, state_digest

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _state(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(64, 32, generator=g).to(dtype),
        "layer.0.weight": torch.randn(32, 32, generator=g).to(dtype),
        "layer.0.bias": torch.randn(32, generator=g).to(dtype),
        "norm.weight": torch.ones(32, dtype=dtype),
    }


def _adam_like_step(state, lr, seed):
    """Every element gets a small update; in low precision many round back to the same value."""
    g = torch.Generator().manual_seed(seed)
    return {
        n: (t.float() - lr * torch.sign(torch.randn(t.shape, generator=g))).to(t.dtype)
        for n, t in state.items()
    }


def _bits_equal(a, b):
    assert a.keys() == b.keys()
    for n in a:
        assert a[n].dtype == b[n].dtype and a[n].shape == b[n].shape
        assert torch.equal(a[n].view(-1).view(torch.uint8), b[n].view(-1).view(torch.uint8)), n


def _clone(state):
    return {n: t.clone() for n, t in state.items()}


@pytest.mark.parametrize("dtype", DTYPES)
def test_dense_update_roundtrip_is_bit_exact(dtype):
    old = _state(dtype)
    new = _adam_like_step(old, lr=1e-1, seed=1)
    delta = SparseDelta.from_bytes(SparseDelta.compute(old, new).to_bytes())
    target = _clone(old)
    delta.apply_(target)
    _bits_equal(target, new)
    assert delta.digest == state_digest(new) and delta.parent_digest == state_digest(old)
    assert any(e.kind == "dense" for e in delta.tensors.values())


@pytest.mark.parametrize(
    ("dtype", "lr"), [(torch.float32, 1e-6), (torch.bfloat16, 2e-4), (torch.float16, 2e-5)]
)
def test_small_lr_update_in_low_precision_is_sparse(dtype, lr):
    old = _state(dtype)
    new = _adam_like_step(old, lr=lr, seed=2)
    delta = SparseDelta.compute(old, new)
    target = _clone(old)
    SparseDelta.from_bytes(delta.to_bytes()).apply_(target)
    _bits_equal(target, new)
    full = sum(t.numel() * t.element_size() for t in new.values())
    assert delta.nbytes <= full
    if dtype != torch.float32:
        # such a step is below half an ulp of most O(1) bf16/fp16 values: few elements change,
        # and the delta stores only those
        iv = torch.int16
        changed = sum(int((old[n].view(iv) != new[n].view(iv)).sum()) for n in new)
        numel = sum(t.numel() for t in new.values())
        assert 0 < changed < 0.3 * numel
        assert delta.changed_elements == changed
        assert delta.nbytes < 0.5 * full
        assert all(e.kind in ("sparse", "mask") for e in delta.tensors.values())


@pytest.mark.parametrize("dtype", DTYPES)
def test_few_changed_elements_store_only_those(dtype):
    old = _state(dtype)
    new = _clone(old)
    new["layer.0.weight"].view(-1)[[3, 17, 1000]] += 1
    new["norm.weight"][5] = float("nan")
    new["layer.0.bias"][0] = -0.0 if old["layer.0.bias"][0] == 0 else -old["layer.0.bias"][0]
    delta = SparseDelta.compute(old, new)
    assert set(delta.tensors) == {"layer.0.weight", "norm.weight", "layer.0.bias"}
    assert delta.tensors["layer.0.weight"].kind == "sparse"
    assert delta.tensors["layer.0.weight"].flat_indices().tolist() == [3, 17, 1000]
    assert delta.tensors["layer.0.weight"].indices.dtype == torch.int32
    target = _clone(old)
    SparseDelta.from_bytes(delta.to_bytes()).apply_(target)
    _bits_equal(target, new)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fraction", [0.01, 0.1, 0.25, 0.45, 0.9])
def test_encoding_is_the_cheapest_and_exact_at_every_density(dtype, fraction):
    g = torch.Generator().manual_seed(int(fraction * 100))
    old = {"w": torch.randn(1003, generator=g).to(dtype)}  # not a multiple of 8: mask padding
    new = _clone(old)
    hit = torch.rand(1003, generator=g) < fraction
    new["w"][hit] = torch.randn(int(hit.sum()), generator=g).to(dtype)
    delta = SparseDelta.from_bytes(SparseDelta.compute(old, new).to_bytes())
    entry = delta.tensors["w"]
    count, item, numel = (
        int((old["w"].view(-1).ne(new["w"].view(-1))).sum()),
        new["w"].element_size(),
        1003,
    )
    costs = {
        "sparse": count * (4 + item),
        "mask": (numel + 7) // 8 + count * item,
        "dense": numel * item,
    }
    assert entry.nbytes == min(costs.values())
    assert entry.kind == min(costs, key=lambda k: (costs[k], k != "dense"))
    target = _clone(old)
    delta.apply_(target)
    _bits_equal(target, new)


def test_mask_with_wrong_popcount_is_rejected():
    old = {"w": torch.zeros(64)}
    new = {"w": torch.zeros(64)}
    new["w"][::4] = 1.0
    delta = SparseDelta.compute(old, new)
    assert delta.tensors["w"].kind == "mask"
    delta.tensors["w"].indices[0] |= 0b10  # claim one more changed element than values
    with pytest.raises(DeltaError, match="bitmask"):
        SparseDelta.from_bytes(delta.to_bytes())


def test_signed_zero_and_nan_payloads_are_changes():
    old = {"w": torch.tensor([0.0, float("nan")] + [1.0] * 14)}
    new = _clone(old)
    new["w"][0] = -0.0
    new["w"].view(torch.int32)[1] ^= 1  # another NaN payload
    delta = SparseDelta.compute(old, new)
    assert delta.tensors["w"].flat_indices().tolist() == [0, 1]
    target = _clone(old)
    delta.apply_(target)
    _bits_equal(target, new)


def test_chain_of_deltas_applies_in_order():
    states = [_state(torch.bfloat16)]
    for i in range(3):
        states.append(_adam_like_step(states[-1], lr=1e-2, seed=10 + i))
    deltas = [
        SparseDelta.from_bytes(SparseDelta.compute(a, b).to_bytes())
        for a, b in zip(states, states[1:], strict=False)
    ]
    target = _clone(states[0])
    DeltaChain(deltas).apply_(target)
    _bits_equal(target, states[-1])
    with pytest.raises(DeltaError, match="broken"):
        DeltaChain([deltas[0], deltas[2]])


def test_wrong_parent_is_rejected_without_changing_the_state():
    old = _state(torch.float32)
    new = _adam_like_step(old, 1e-2, seed=3)
    other = _adam_like_step(old, 1e-2, seed=4)
    delta = SparseDelta.compute(old, new)
    target = _clone(other)
    with pytest.raises(DeltaError, match="applies to state"):
        delta.apply_(target)
    _bits_equal(target, other)


def test_corrupted_values_fail_the_result_digest():
    old = _state(torch.float16)
    new = _adam_like_step(old, 1e-1, seed=5)
    data = bytearray(SparseDelta.compute(old, new).to_bytes())
    data[-3] ^= 0xFF  # flip bits inside the last tensor's payload
    delta = SparseDelta.from_bytes(bytes(data))
    with pytest.raises(DeltaError, match="corrupt"):
        delta.apply_(_clone(old))


@pytest.mark.parametrize("cut", [0, 7, 100, -1])
def test_truncated_delta_bytes_are_rejected(cut):
    old = _state(torch.float32)
    data = SparseDelta.compute(old, _adam_like_step(old, 1e-2, seed=6)).to_bytes()
    with pytest.raises(DeltaError, match="truncated or corrupt|metadata"):
        SparseDelta.from_bytes(data[:cut] if cut >= 0 else data[:-1])


def test_mismatched_states_are_rejected():
    old = _state(torch.float32)
    with pytest.raises(DeltaError, match="tensor names"):
        SparseDelta.compute(old, {**old, "extra": torch.zeros(1)})
    with pytest.raises(DeltaError, match="dtypes and shapes"):
        SparseDelta.compute(old, {**old, "norm.weight": torch.ones(32, dtype=torch.float16)})


def test_shape_mismatch_on_apply_is_rejected():
    old = _state(torch.float32)
    delta = SparseDelta.compute(old, _adam_like_step(old, 1e-2, seed=7))
    bad = _clone(old)
    bad["layer.0.bias"] = torch.zeros(31)
    with pytest.raises(DeltaError, match="expects"):
        delta.apply_(bad, verify=False)


def test_digest_depends_on_names_dtypes_shapes_and_bits():
    a = {"w": torch.zeros(4)}
    assert state_digest(a) == state_digest({"w": torch.zeros(4)})
    assert state_digest(a) != state_digest({"v": torch.zeros(4)})
    assert state_digest(a) != state_digest({"w": torch.zeros(2, 2)})
    assert state_digest(a) != state_digest({"w": torch.zeros(4, dtype=torch.int32)})
    assert state_digest(a) != state_digest({"w": torch.tensor([0.0, 0.0, 0.0, -0.0])})


# ----------------------------------------------------------------------------- coded entries


def _rl_step(n=1 << 17, seed=0, lr=1e-6):
    """A large bf16 tensor published from fp32 masters after an Adam-like step of ``lr``."""
    g = torch.Generator().manual_seed(seed)
    master = torch.randn(n, generator=g) * 0.02
    stepped = master - lr * torch.sign(torch.randn(n, generator=g))
    return {"w": master.to(torch.bfloat16)}, {"w": stepped.to(torch.bfloat16)}


def test_rl_lr_step_is_coded_small_and_bit_exact():
    old, new = _rl_step()
    delta = SparseDelta.compute(old, new)
    entry = delta.tensors["w"]
    assert entry.kind == "coded"
    raw = SparseDelta.from_bytes(delta.to_bytes())
    target = _clone(old)
    raw.apply_(target)
    _bits_equal(target, new)
    changed = int((old["w"].view(torch.int16) != new["w"].view(torch.int16)).sum())
    assert raw.changed_elements == changed
    # int32 indices + bf16 values would take 6 bytes per changed element
    assert delta.nbytes < 0.5 * 6 * changed
    assert len(delta.to_bytes()) < 0.03 * new["w"].numel() * 2


def test_coded_differences_wrap_at_the_integer_width():
    n = 1 << 16
    old = {"w": torch.zeros(n, dtype=torch.float16)}
    new = _clone(old)
    bits_old, bits_new = old["w"].view(torch.int16), new["w"].view(torch.int16)
    bits_old[:10] = 32767  # NaN payloads at the top of the int16 range ...
    bits_new[:10] = -32768  # ... become -0.0: a difference that wraps
    bits_new[1000:1003] = 0x7C00  # +inf
    delta = SparseDelta.compute(old, new)
    assert delta.tensors["w"].kind == "coded"
    target = _clone(old)
    SparseDelta.from_bytes(delta.to_bytes()).apply_(target)
    _bits_equal(target, new)


def _coded_blob():
    old, new = _rl_step(seed=3)
    return old, SparseDelta.compute(old, new)


def test_corrupt_coded_streams_are_rejected():
    old, delta = _coded_blob()
    entry = delta.tensors["w"]
    gaps, diffs = entry.wire
    bad = [
        (zlib.compress(b"\x00" * entry.values.numel()), diffs, "strictly increasing"),
        (zlib.compress(b"\x01" * 5), diffs, "varints"),
        (gaps, zlib.compress(b"\x00" * 3), "difference bytes"),
        (gaps, b"not zlib at all", "corrupt compressed stream"),
        (gaps, zlib.compress(b"\x00" * (10 * entry.values.numel())), "longer than announced"),
        (zlib.compress(b"\x7f" * entry.values.numel()), diffs, "outside"),
    ]
    for g, d, match in bad:
        entry.wire = (g, d)
        with pytest.raises(DeltaError, match=match):
            SparseDelta.from_bytes(delta.to_bytes())


def test_format_1_deltas_are_still_read(monkeypatch):
    import astraflow.weights.delta as D

    old = _state(torch.bfloat16)
    new = _adam_like_step(old, lr=1e-2, seed=8)
    monkeypatch.setattr(D, "FORMAT", "astraflow.sparse-delta/1")
    blob = SparseDelta.compute(old, new).to_bytes()
    monkeypatch.undo()
    target = _clone(old)
    SparseDelta.from_bytes(blob).apply_(target)
    _bits_equal(target, new)


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is false)"
)
def test_every_entry_kind_applies_bit_exact_to_cuda_tensors():
    """The GPU branch of ``apply_``: dense, sparse, mask and coded entries written into CUDA
    tensors in place give the same bits as the trainer's state, and the digests verify."""
    old = _state(torch.float32)
    new = _clone(old)
    new["embed.weight"] = _adam_like_step({"w": old["embed.weight"]}, 1e-1, seed=3)["w"]  # dense
    new["layer.0.weight"].view(-1)[[3, 17, 1000]] += 1  # sparse
    new["layer.0.bias"][::4] += 1  # mask
    coded_old, coded_new = _rl_step(n=1 << 16)
    old["coded"], new["coded"] = coded_old["w"], coded_new["w"]
    delta = SparseDelta.from_bytes(SparseDelta.compute(old, new).to_bytes())
    assert {e.kind for e in delta.tensors.values()} == {"dense", "sparse", "mask", "coded"}
    target = {n: t.to("cuda") for n, t in old.items()}
    pointers = {n: t.data_ptr() for n, t in target.items()}
    delta.apply_(target)  # verify=True: the parent and the result digests are checked
    assert {n: t.data_ptr() for n, t in target.items()} == pointers  # in place
    assert all(t.device.type == "cuda" for t in target.values())
    _bits_equal({n: t.cpu() for n, t in target.items()}, new)
