"""Sparse, bit-exact weight deltas between consecutive versions.

Why: after a small optimizer step many elements of a bf16/fp16 model do not change at all (the
update is below half an ulp), so shipping only the changed elements' indices and new values is far
smaller than a full snapshot. Elements are compared as integers of the same width, so -0.0 vs 0.0
and NaN payloads count as changes and are reproduced exactly.

Each changed tensor is stored in the cheapest of four encodings of the same information:
``sparse`` (int32 flat indices + values: best below ~3% changed), ``mask`` (a packed bitmask of
changed elements, little-endian bit order, + values: best at medium densities, e.g. the ~25% of
bf16 elements a 1e-5 AdamW step moves), ``dense`` (the whole tensor) or ``coded`` (compressed, for
tensors of at least :data:`CODED_MIN_ELEMENTS` elements): the gaps between consecutive changed
indices as LEB128 varints and the changes as integer differences ``new_bits - old_bits`` (modulo
2**width, so still bit-exact), each stream zlib-compressed. At an RL learning rate (1e-6, bf16
published from fp32 masters) ~2-4% of elements change, nearly all by exactly one ulp: a gap takes
about one byte and a difference compresses to a few bits, so the delta is ~1.5-2% of the snapshot
instead of ~6-8% with int32 indices and raw values (bench/weight_sync.py, ``rl_lr`` cases).
A ``coded`` entry can only be applied on top of its parent (the digest check already demands it).

Wire format: one safetensors file (never pickle) holding, for entry ``i``, ``"{i}.values"`` and for
sparse entries ``"{i}.indices"`` (int32, or int64 for tensors of 2**31 elements or more) or for mask
entries ``"{i}.mask"`` (uint8, ``ceil(numel / 8)`` bytes, padding bits zero); coded entries hold
``"{i}.gaps"`` and ``"{i}.diffs"`` (uint8, zlib streams) and their ``count`` of changed elements.
A JSON document in the safetensors header metadata under ``"astraflow.delta"`` names each entry's
tensor, kind, dtype and shape, and the parent and result digests. Readers accept format 1 (no
coded entries) and 2.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from astraflow.errors import AstraFlowError
from astraflow.weights.digest import state_digest

FORMAT = "astraflow.sparse-delta/2"
#: Formats this module reads (format 1 is format 2 without ``coded`` entries).
READ_FORMATS = ("astraflow.sparse-delta/1", FORMAT)
METADATA_KEY = "astraflow.delta"
#: Tensors smaller than this are never ``coded``: the zlib streams' fixed overhead and the time
#: spent compressing buy nothing there; the bytes are in the large matrices.
CODED_MIN_ELEMENTS = 1 << 16
#: ``coded`` is tried only up to this fraction of changed elements (above it the differences are
#: not small and the mask or dense encodings win; compressing would only cost time).
CODED_MAX_DENSITY = 0.5
ZLIB_LEVEL = 1


class DeltaError(AstraFlowError, ValueError):
    """A delta that is malformed, does not fit the tensors, or yields the wrong digest."""


def _int_view_dtype(dtype: Any):
    import torch

    sizes = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    try:
        return sizes[dtype.itemsize]
    except KeyError:
        raise DeltaError(f"unsupported tensor dtype {dtype} for a bitwise delta") from None


def _dtype_from_name(name: str):
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise DeltaError(f"unknown dtype {name!r} in delta metadata")
    return dtype


@dataclass
class TensorDelta:
    """Change of one tensor: ``values`` at flat ``indices`` (sparse), at the set bits of the packed
    bitmask ``indices`` (mask), or the whole tensor (dense). A ``coded`` entry holds the decoded
    flat ``indices`` (int64), ``values`` = the integer differences to add to the parent's bits (an
    integer tensor of the dtype's width) and ``wire`` = the two compressed streams it came from."""

    kind: Literal["sparse", "mask", "dense", "coded"]
    dtype: Any
    shape: tuple[int, ...]
    values: Any
    indices: Any | None = None
    wire: tuple[bytes, bytes] | None = None

    def flat_index_array(self) -> np.ndarray:
        """Flat int64 indices of the elements this entry writes, whatever its encoding."""
        numel = int(np.prod(self.shape, dtype=np.int64))
        if self.kind == "dense":
            return np.arange(numel, dtype=np.int64)
        if self.kind == "mask":
            return np.flatnonzero(unpack_mask(self.indices.numpy(), numel))
        return self.indices.numpy().astype(np.int64, copy=False)

    def flat_indices(self):
        """:meth:`flat_index_array` as a torch tensor."""
        import torch

        return torch.from_numpy(self.flat_index_array())

    @property
    def nbytes(self) -> int:
        if self.wire is not None:
            return len(self.wire[0]) + len(self.wire[1])
        n = self.values.numel() * self.values.element_size()
        if self.indices is not None:
            n += self.indices.numel() * self.indices.element_size()
        return n


@dataclass
class SparseDelta:
    """Bit-exact difference between two states with the same tensor names, dtypes and shapes."""

    parent_digest: str
    digest: str
    tensors: dict[str, TensorDelta] = field(default_factory=dict)

    # ----------------------------------------------------------------- construction
    @classmethod
    def compute(
        cls,
        old: Mapping[str, Any],
        new: Mapping[str, Any],
        *,
        old_digest: str | None = None,
        new_digest: str | None = None,
    ) -> SparseDelta:
        """Delta turning ``old`` into ``new`` (digests are computed unless given)."""

        if set(old) != set(new):
            missing, extra = sorted(set(old) - set(new)), sorted(set(new) - set(old))
            raise DeltaError(
                f"states differ in tensor names (only in old: {missing[:5]}, only in new: "
                f"{extra[:5]}); a delta needs the same names, send a full snapshot instead"
            )
        entries: dict[str, TensorDelta] = {}
        for name in sorted(new):
            a, b = old[name].detach(), new[name].detach()
            if a.dtype != b.dtype or a.shape != b.shape:
                raise DeltaError(
                    f"tensor {name!r} changed from {a.dtype}{tuple(a.shape)} to "
                    f"{b.dtype}{tuple(b.shape)}; a delta needs equal dtypes and shapes"
                )
            iv = _int_view_dtype(b.dtype)
            a_bits = a.cpu().contiguous().reshape(-1).view(iv).numpy()
            b_bits = b.cpu().contiguous().reshape(-1).view(iv).numpy()
            changed = np.not_equal(a_bits, b_bits)
            count = int(np.count_nonzero(changed))
            if count == 0:
                continue
            entries[name] = _encode(changed, count, b_bits, b.dtype, tuple(b.shape), a_bits)
        return cls(
            parent_digest=old_digest or state_digest(old),
            digest=new_digest or state_digest(new),
            tensors=entries,
        )

    # ----------------------------------------------------------------- application
    def apply_(
        self,
        tensors: MutableMapping[str, Any],
        verify: bool = True,
        parent_digest: str | None = None,
    ) -> None:
        """Apply in place to ``tensors`` (CPU or GPU); checks the parent and result digests.

        Raises :class:`DeltaError` when the state is not this delta's parent (nothing is changed
        then) or, after applying, when the result's digest is not :attr:`digest` (the state is then
        unusable and must be replaced by a full snapshot). ``parent_digest`` is the digest of
        ``tensors`` when the caller already knows it (the result of its previous verified apply):
        it stands in for re-hashing the whole state before applying.
        """
        import torch

        if verify:
            have = parent_digest or state_digest(tensors)
            if have != self.parent_digest:
                raise DeltaError(
                    f"delta applies to state {self.parent_digest[:19]}…, but the tensors are "
                    f"{have[:19]}…; fetch the matching chain or a full snapshot"
                )
        self._check_fits(tensors)
        for name, entry in self.tensors.items():
            target = tensors[name]
            flat = target.data.view(-1)
            iv = _int_view_dtype(target.dtype)
            if entry.kind == "dense":
                flat.copy_(entry.values.to(target.device, non_blocking=True))
                continue
            idx = entry.flat_index_array()
            values = entry.values.view(iv)
            if entry.kind == "coded":
                # new bits = parent bits + difference, wrapping at the integer width
                if flat.device.type == "cpu":
                    bits = flat.view(iv).numpy()
                    bits[idx] += values.numpy()
                else:
                    dev_idx = torch.from_numpy(idx).to(flat.device, non_blocking=True)
                    ints = flat.view(iv)
                    new = ints.index_select(0, dev_idx) + values.to(flat.device)
                    ints.index_copy_(0, dev_idx, new)
                continue
            if flat.device.type == "cpu":
                # numpy's fancy assignment is several times faster than torch's on CPU
                flat.view(iv).numpy()[idx] = values.numpy()
            else:
                dev_idx = torch.from_numpy(idx).to(flat.device, non_blocking=True)
                flat.view(iv).index_copy_(0, dev_idx, values.to(flat.device, non_blocking=True))
        if verify:
            got = state_digest(tensors)
            if got != self.digest:
                raise DeltaError(
                    f"state after applying the delta is {got[:19]}…, expected "
                    f"{self.digest[:19]}…; the delta is corrupt, reload a full snapshot"
                )

    def _check_fits(self, tensors: Mapping[str, Any]) -> None:
        for name, entry in self.tensors.items():
            if name not in tensors:
                raise DeltaError(f"delta changes tensor {name!r}, which the state does not have")
            t = tensors[name]
            if t.dtype != entry.dtype or tuple(t.shape) != entry.shape:
                raise DeltaError(
                    f"tensor {name!r} is {t.dtype}{tuple(t.shape)}, the delta expects "
                    f"{entry.dtype}{entry.shape}"
                )
            if not t.is_contiguous():
                raise DeltaError(f"tensor {name!r} is not contiguous; cannot update it in place")

    @property
    def nbytes(self) -> int:
        """Payload bytes (indices + values), i.e. roughly the size of :meth:`to_bytes`."""
        return sum(e.nbytes for e in self.tensors.values())

    @property
    def changed_elements(self) -> int:
        return sum(e.values.numel() for e in self.tensors.values())

    # ----------------------------------------------------------------- wire format
    def to_bytes(self) -> bytes:
        from safetensors.torch import save

        arrays: dict[str, Any] = {}
        entries = []
        for i, (name, entry) in enumerate(sorted(self.tensors.items())):
            record = {
                "name": name,
                "kind": entry.kind,
                "dtype": str(entry.dtype).removeprefix("torch."),
                "shape": list(entry.shape),
            }
            if entry.kind == "coded":
                import torch

                gaps, diffs = entry.wire
                arrays[f"{i}.gaps"] = torch.frombuffer(bytearray(gaps), dtype=torch.uint8)
                arrays[f"{i}.diffs"] = torch.frombuffer(bytearray(diffs), dtype=torch.uint8)
                record["count"] = int(entry.values.numel())
                entries.append(record)
                continue
            arrays[f"{i}.values"] = entry.values.contiguous()
            if entry.kind == "sparse":
                arrays[f"{i}.indices"] = entry.indices.contiguous()
            elif entry.kind == "mask":
                arrays[f"{i}.mask"] = entry.indices.contiguous()
            entries.append(record)
        meta = {
            "format": FORMAT,
            "parent_digest": self.parent_digest,
            "digest": self.digest,
            "entries": entries,
        }
        return save(arrays, metadata={METADATA_KEY: json.dumps(meta)})

    @classmethod
    def from_bytes(cls, data: bytes) -> SparseDelta:
        """Parse and validate :meth:`to_bytes` output; truncated or malformed input raises."""
        import torch
        from safetensors.torch import load

        try:
            arrays = load(bytes(data))
        except Exception as exc:  # safetensors raises its own error types
            raise DeltaError(f"not a valid delta file (truncated or corrupt): {exc}") from exc
        # The metadata is not exposed by `load`; parse the header directly (8-byte length + JSON).
        try:
            header_len = int.from_bytes(data[:8], "little")
            header = json.loads(bytes(data[8 : 8 + header_len]))
            meta = json.loads(header["__metadata__"][METADATA_KEY])
        except (ValueError, KeyError, TypeError) as exc:
            raise DeltaError(f"delta file has no valid {METADATA_KEY!r} metadata: {exc}") from exc
        if not isinstance(meta, dict) or meta.get("format") not in READ_FORMATS:
            found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
            raise DeltaError(f"unsupported delta format {found!r}, expected one of {READ_FORMATS}")
        for key in ("parent_digest", "digest"):
            if not isinstance(meta.get(key), str):
                raise DeltaError(f"delta metadata lacks the {key!r} string")
        entries: dict[str, TensorDelta] = {}
        for i, e in enumerate(meta.get("entries", [])):
            try:
                name, kind, shape = e["name"], e["kind"], tuple(int(s) for s in e["shape"])
                dtype = _dtype_from_name(e["dtype"])
                if kind == "coded":
                    entries[name] = _decode_coded(e, dtype, shape, arrays, i)
                    continue
                values = arrays[f"{i}.values"]
            except DeltaError:
                raise
            except KeyError as exc:
                raise DeltaError(f"delta entry {i} is missing {exc}") from exc
            except (TypeError, ValueError) as exc:
                raise DeltaError(f"delta entry {i} is malformed: {exc}") from exc
            numel = 1
            for s in shape:
                numel *= s
            if values.dtype != dtype or values.dim() != 1:
                raise DeltaError(f"delta entry {name!r}: values must be 1-D {dtype}")
            indices = None
            if kind == "dense":
                if values.numel() != numel:
                    raise DeltaError(
                        f"dense entry {name!r} has {values.numel()} values, want {numel}"
                    )
            elif kind == "sparse":
                indices = arrays.get(f"{i}.indices")
                if indices is None or indices.dtype not in (torch.int32, torch.int64):
                    raise DeltaError(f"sparse entry {name!r} lacks int32/int64 indices")
                if indices.shape != values.shape:
                    raise DeltaError(
                        f"sparse entry {name!r}: {indices.numel()} indices vs {values.numel()} values"
                    )
                idx_np = indices.numpy()
                if idx_np.size and (int(idx_np.min()) < 0 or int(idx_np.max()) >= numel):
                    raise DeltaError(f"sparse entry {name!r} has indices outside [0, {numel})")
            elif kind == "mask":
                indices = arrays.get(f"{i}.mask")
                if indices is None or indices.dtype != torch.uint8 or indices.dim() != 1:
                    raise DeltaError(f"mask entry {name!r} lacks a 1-D uint8 bitmask")
                if indices.numel() != (numel + 7) // 8:
                    raise DeltaError(
                        f"mask entry {name!r}: {indices.numel()} mask bytes, want {(numel + 7) // 8}"
                    )
                bits = unpack_mask(indices.numpy(), (numel + 7) // 8 * 8)
                if bits[numel:].any() or int(np.count_nonzero(bits)) != values.numel():
                    raise DeltaError(
                        f"mask entry {name!r}: the bitmask does not match its {values.numel()} values"
                    )
            else:
                raise DeltaError(f"delta entry {name!r} has unknown kind {kind!r}")
            entries[name] = TensorDelta(kind, dtype, shape, values, indices)
        return cls(parent_digest=meta["parent_digest"], digest=meta["digest"], tensors=entries)


def pack_mask(mask: np.ndarray) -> np.ndarray:
    """Packed little-endian bitmask (uint8, ``ceil(n / 8)`` bytes) of a 1-D bool array."""
    return np.packbits(mask, bitorder="little")


def unpack_mask(packed: np.ndarray, n: int) -> np.ndarray:
    """The first ``n`` bits of a :func:`pack_mask` bitmask as a bool array."""
    return np.unpackbits(packed, count=n, bitorder="little").view(np.bool_)


def _encode(
    changed: np.ndarray,
    count: int,
    new_bits: np.ndarray,
    dtype,
    shape,
    old_bits: np.ndarray | None = None,
) -> TensorDelta:
    """The cheapest of the sparse / mask / dense / coded encodings of one changed tensor.

    ``changed`` is the bool array of changed elements, ``new_bits`` (``old_bits``) the new (old)
    tensor viewed as integers of its width (so values are copied bit for bit). ``coded`` is
    considered only with ``old_bits``, for tensors of at least :data:`CODED_MIN_ELEMENTS` elements
    and at most :data:`CODED_MAX_DENSITY` changed.
    """
    import torch

    numel, item = new_bits.size, new_bits.itemsize
    index_dtype = np.int32 if numel < 2**31 else np.int64
    costs = {
        "sparse": count * (np.dtype(index_dtype).itemsize + item),
        "mask": (numel + 7) // 8 + count * item,
        "dense": numel * item,
    }
    idx = None
    coded = None
    if old_bits is not None and numel >= CODED_MIN_ELEMENTS and count <= CODED_MAX_DENSITY * numel:
        idx = np.flatnonzero(changed)
        diffs = new_bits[idx] - old_bits[idx]  # wraps at the integer width: bit-exact
        coded = (_compress(_leb128(np.diff(idx, prepend=-1))), _compress(diffs.tobytes()))
        costs["coded"] = len(coded[0]) + len(coded[1])
    kind = min(costs, key=lambda k: (costs[k], k != "dense"))
    if kind == "dense":
        values = torch.from_numpy(new_bits.copy()).view(dtype)
        return TensorDelta("dense", dtype, shape, values)
    if idx is None:
        idx = np.flatnonzero(changed)
    if kind == "coded":
        return TensorDelta(
            "coded", dtype, shape, torch.from_numpy(diffs), torch.from_numpy(idx), wire=coded
        )
    values = torch.from_numpy(new_bits[idx]).view(dtype)
    if kind == "mask":
        return TensorDelta("mask", dtype, shape, values, torch.from_numpy(pack_mask(changed)))
    return TensorDelta("sparse", dtype, shape, values, torch.from_numpy(idx.astype(index_dtype)))


# ----------------------------------------------------------------------------- coded entries


def _compress(data: bytes) -> bytes:
    return zlib.compress(data, ZLIB_LEVEL)


def _decompress(data: bytes, size: int, what: str) -> bytes:
    """Inflate at most ``size`` bytes (a corrupt or hostile stream cannot inflate further)."""
    d = zlib.decompressobj()
    try:
        out = d.decompress(data, size)
        if d.unconsumed_tail or not d.eof:
            raise DeltaError(f"{what}: the compressed stream is longer than announced or truncated")
    except zlib.error as exc:
        raise DeltaError(f"{what}: corrupt compressed stream: {exc}") from exc
    return out


def _leb128(values: np.ndarray) -> bytes:
    """Unsigned LEB128 varints of non-negative int64 ``values`` (7 bits a byte, low bits first)."""
    v = values.astype(np.uint64)
    nbytes = np.ones(v.size, dtype=np.int64)
    for k in range(1, 10):
        big = v >= np.uint64(1 << (7 * k))
        if not big.any():
            break
        nbytes += big
    out = np.empty(int(nbytes.sum()), dtype=np.uint8)
    starts = np.cumsum(nbytes) - nbytes
    rest, where, left = v, starts, nbytes
    while rest.size:
        more = left > 1
        out[where] = (rest & np.uint64(0x7F)).astype(np.uint8) | (more.astype(np.uint8) << 7)
        rest, where, left = rest[more] >> np.uint64(7), where[more] + 1, left[more] - 1
    return out.tobytes()


def _unleb128(data: bytes, count: int, what: str) -> np.ndarray:
    """Inverse of :func:`_leb128`: exactly ``count`` values, else :class:`DeltaError`."""
    b = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(b < 0x80)  # the last byte of each value has its high bit clear
    if ends.size != count or (count and ends[-1] != b.size - 1):
        raise DeltaError(f"{what}: expected {count} varints in {b.size} bytes, found {ends.size}")
    if count == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts + 1
    if int(lengths.max()) == 1:
        return b.astype(np.int64)
    if int(lengths.max()) > 9:
        raise DeltaError(f"{what}: a varint is longer than 9 bytes")
    shift = (np.arange(b.size, dtype=np.int64) - np.repeat(starts, lengths)) * 7
    parts = (b & 0x7F).astype(np.int64) << shift
    return np.add.reduceat(parts, starts)


def _decode_coded(e: dict, dtype, shape: tuple[int, ...], arrays: dict, i: int) -> TensorDelta:
    """Parse and validate one ``coded`` entry of :meth:`SparseDelta.from_bytes`."""
    import torch

    name = e["name"]
    what = f"coded entry {name!r}"
    count = int(e["count"])
    numel = int(np.prod(shape, dtype=np.int64))
    if not 0 < count <= numel:
        raise DeltaError(f"{what}: count {count} outside (0, {numel}]")
    iv = _int_view_dtype(dtype)
    item = torch.empty(0, dtype=iv).element_size()
    streams = []
    for part in ("gaps", "diffs"):
        t = arrays.get(f"{i}.{part}")
        if t is None or t.dtype != torch.uint8 or t.dim() != 1:
            raise DeltaError(f"{what} lacks a 1-D uint8 {part!r} stream")
        streams.append(t.numpy().tobytes())
    gaps = _unleb128(_decompress(streams[0], 10 * count, what), count, what)
    if int(gaps.min()) < 1:
        raise DeltaError(f"{what}: indices are not strictly increasing")
    idx = np.cumsum(gaps) - 1
    if int(idx[-1]) >= numel:
        raise DeltaError(f"{what} has indices outside [0, {numel})")
    raw = _decompress(streams[1], count * item, what)
    if len(raw) != count * item:
        raise DeltaError(f"{what}: {len(raw)} difference bytes, want {count * item}")
    diffs = torch.frombuffer(bytearray(raw), dtype=iv)
    return TensorDelta(
        "coded", dtype, shape, diffs, torch.from_numpy(idx), wire=(streams[0], streams[1])
    )


@dataclass
class DeltaChain:
    """Consecutive deltas applied as one update (``apply_`` like :class:`SparseDelta`)."""

    deltas: list[SparseDelta]

    def __post_init__(self):
        if not self.deltas:
            raise DeltaError("a delta chain needs at least one delta")
        for prev, nxt in zip(self.deltas, self.deltas[1:], strict=False):
            if nxt.parent_digest != prev.digest:
                raise DeltaError(
                    "delta chain is broken: a delta's parent is not the previous result"
                )

    @property
    def parent_digest(self) -> str:
        return self.deltas[0].parent_digest

    @property
    def digest(self) -> str:
        return self.deltas[-1].digest

    @property
    def nbytes(self) -> int:
        return sum(d.nbytes for d in self.deltas)

    def apply_(
        self,
        tensors: MutableMapping[str, Any],
        verify: bool = True,
        parent_digest: str | None = None,
    ) -> None:
        """Apply every delta in order; digests are checked once at each end of the chain
        (``parent_digest`` as in :meth:`SparseDelta.apply_`)."""
        if verify:
            have = parent_digest or state_digest(tensors)
            if have != self.parent_digest:
                raise DeltaError(
                    f"delta chain applies to {self.parent_digest[:19]}…, the tensors are {have[:19]}…"
                )
        for d in self.deltas:
            d.apply_(tensors, verify=False)
        if verify:
            got = state_digest(tensors)
            if got != self.digest:
                raise DeltaError(
                    f"state after the delta chain is {got[:19]}…, expected {self.digest[:19]}…"
                )
