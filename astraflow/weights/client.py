"""Node side of the weight store: fetch what moves an engine from its version to the wanted one.

Decision rule: when the node holds version ``have`` with digest ``have_digest`` and ``have`` is at
most ``max_chain`` versions behind, every delta in between exists and chains from that digest, and
the deltas together are smaller than the snapshot, fetch the deltas; otherwise fetch the full
snapshot. Every transferred file is checked against its
length and sha256 before it is parsed, and the resulting state's digest is checked when applied
(deltas) or on load (full), so truncated or corrupted transfers are rejected, never installed.

Where the bytes come from is a :class:`~astraflow.weights.source.WeightSource`: an ``http(s)://``
URL of a trainer's weight server or a weight cache, a shared store directory, or any object with
the interface; the rule and the checks above are the same for each.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from astraflow.weights.delta import DeltaChain, DeltaError, SparseDelta
from astraflow.weights.digest import bytes_digest, state_digest
from astraflow.weights.source import (
    ChunkSink,
    FileKind,
    WeightSource,
    WeightTransferError,
    open_weight_source,
)
from astraflow.weights.store import WeightStoreError
from astraflow.weights.update import WeightUpdate

__all__ = ["WeightClient", "WeightTransferError", "check_bytes"]


class WeightClient:
    """Fetches verified weight updates from one :class:`WeightSource` (``source``: a URL, a store
    directory or a source object; ``token``, ``timeout``, ``retries``, ``backoff`` and ``ca_file``
    configure an HTTP source)."""

    def __init__(
        self,
        source: str | Path | WeightSource,
        token: str | None = None,
        *,
        max_chain: int = 4,
        timeout: float = 60.0,
        retries: int = 4,
        backoff: float = 0.25,
        ca_file: str | Path | None = None,
    ):
        self.max_chain = max_chain
        self.backend = open_weight_source(
            source, token, timeout=timeout, retries=retries, backoff=backoff, ca_file=ca_file
        )
        self.source = self.backend.location

    def close(self) -> None:
        self.backend.close()

    def __enter__(self) -> WeightClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- metadata
    def meta(self, policy: str, version: int | None = None) -> dict[str, Any] | None:
        """meta.json of ``version`` (latest when None); None when the policy has no versions."""
        return self.backend.meta(policy, version)

    # ----------------------------------------------------------------- the update
    def fetch_update(
        self,
        policy: str,
        have_version: int | None = None,
        have_digest: str | None = None,
        want_version: int | None = None,
    ) -> WeightUpdate | None:
        """Update from ``have_version`` to ``want_version`` (latest when None).

        Without ``have_digest`` the node is trusted to hold the store's ``have_version``; the
        delta's ``apply_`` still checks the parent digest and raises ``DeltaError`` if it does not
        (the caller then asks again with ``have_version=None`` for the full snapshot).
        Returns None when the node already holds the wanted version (same digest) or the policy
        has no versions yet.
        """
        want = self.meta(policy, want_version)
        if want is None:
            return None
        target = int(want["version"])
        if have_version == target and (have_digest is None or have_digest == want["digest"]):
            return None
        chain = self._delta_chain(policy, have_version, have_digest, target, want)
        if chain is not None:
            return WeightUpdate(
                version=target, delta=chain, parent=have_version, digest=want["digest"]
            )
        return WeightUpdate(
            version=target, full=self.fetch_full(policy, target, want), digest=want["digest"]
        )

    def fetch_full(
        self, policy: str, version: int, meta: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The verified full state of ``version`` as CPU tensors."""
        from safetensors.torch import load

        meta = meta or self.meta(policy, version)
        data = self.fetch_file(policy, version, "full", meta["full_bytes"], meta["full_sha256"])
        try:
            state = load(data)
        except Exception as exc:
            raise WeightTransferError(
                f"full snapshot of {policy} v{version} is unreadable: {exc}"
            ) from exc
        got = state_digest(state)
        if got != meta["digest"]:
            raise WeightTransferError(
                f"full snapshot of {policy} v{version} has digest {got}, expected {meta['digest']}"
            )
        return state

    def _delta_chain(
        self,
        policy: str,
        have: int | None,
        have_digest: str | None,
        target: int,
        target_meta: dict[str, Any] | None = None,
    ) -> DeltaChain | None:
        if have is None or not 0 < target - have <= self.max_chain:
            return None
        metas = []
        for v in range(have + 1, target + 1):
            if v == target and target_meta is not None:
                m = target_meta  # just read by the caller: one round trip fewer
            else:
                try:
                    m = self.meta(policy, v)
                except WeightStoreError:
                    return None  # garbage-collected: fall back to the snapshot
            if m.get("parent") != v - 1 or not m.get("delta_sha256"):
                return None
            metas.append(m)
        if sum(int(m["delta_bytes"]) for m in metas) >= int(metas[-1]["full_bytes"]):
            return None  # the snapshot is no bigger (e.g. fp32 after a large step): take it
        deltas = []
        for m in metas:
            v = int(m["version"])
            data = self.fetch_file(policy, v, "delta", m["delta_bytes"], m["delta_sha256"])
            try:
                delta = SparseDelta.from_bytes(data)
            except DeltaError as exc:
                raise WeightTransferError(f"delta of {policy} v{v}: {exc}") from exc
            if delta.digest != m["digest"]:
                raise WeightTransferError(
                    f"delta of {policy} v{v} does not produce the version's digest"
                )
            deltas.append(delta)
        if have_digest is not None and deltas[0].parent_digest != have_digest:
            return None  # the node's state is not the store's v{have}: take the snapshot
        try:
            return DeltaChain(deltas)
        except DeltaError as exc:
            raise WeightTransferError(f"deltas of {policy} do not chain: {exc}") from exc

    # ----------------------------------------------------------------- verified reads
    def fetch_file(
        self,
        policy: str,
        version: int,
        kind: FileKind,
        size: int,
        sha256: str,
        sink: ChunkSink | None = None,
    ) -> bytes:
        """The bytes of the version's ``kind`` file, checked against ``size`` and ``sha256``;
        ``sink`` sees the bytes as they arrive (a region cache streams them on meanwhile)."""
        if sink is None:  # a source written without ``sink`` still works for the node's reads
            data = self.backend.read(policy, version, kind, size)
        else:
            data = self.backend.read(policy, version, kind, size, sink=sink)
        check_bytes(data, size, sha256, f"{kind} of {policy} v{version}")
        return data


def check_bytes(data: bytes, size: int, sha256: str, what: str) -> None:
    """Reject a transfer whose length or sha256 differs from what the store announced."""
    if len(data) != size:
        raise WeightTransferError(
            f"{what} is truncated or padded: {len(data)} bytes, expected {size}"
        )
    got = bytes_digest(data)
    if got != sha256:
        raise WeightTransferError(f"{what} is corrupt: sha256 {got}, expected {sha256}")
