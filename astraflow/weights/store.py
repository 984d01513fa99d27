"""On-disk weight store: one directory per published version of each policy.

Layout::

    root/<policy>/v<version>/model.safetensors          full snapshot
    root/<policy>/v<version>/delta_from_<v-1>.safetensors sparse delta from the previous version
    root/<policy>/v<version>/meta.json                   WeightVersion + file digests and sizes

A version directory is written under a temporary name and renamed into place, so readers (the HTTP
server, nodes sharing the directory) see either a complete version or none. The trainer owns the
store; nodes read it through :class:`astraflow.weights.client.WeightClient`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from astraflow.errors import AstraFlowError
from astraflow.protocol import WeightVersion
from astraflow.weights.delta import SparseDelta
from astraflow.weights.digest import DIGEST_PREFIX, bytes_digest, state_digest

FULL_FILE = "model.safetensors"
#: The one safetensors metadata key of a snapshot: JSON with the state digest and the version.
SNAPSHOT_METADATA_KEY = "astraflow"
META_FILE = "meta.json"
_POLICY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_VERSION_RE = re.compile(r"^v(\d+)$")


class WeightStoreError(AstraFlowError, ValueError):
    """Bad policy name or version, or a version that is not in the store."""


def delta_file(parent: int) -> str:
    return f"delta_from_{parent}.safetensors"


def snapshot_bytes(state: Mapping[str, Any], digest: str, version: int) -> bytes:
    """The full snapshot file of ``state``: the same bytes for the same state in any process.

    One metadata key only: safetensors writes several in hash-map order, which differs between
    processes, and a region's weight cache rebuilds snapshots from deltas and checks them against
    the sha256 the trainer announced (``astraflow.weights.cache``)."""
    from safetensors.torch import save

    meta = json.dumps({"digest": digest, "version": version}, sort_keys=True)
    return save(dict(state), metadata={SNAPSHOT_METADATA_KEY: meta})


def write_snapshot(path: Path, state: Mapping[str, Any], digest: str, version: int) -> int:
    """Write the snapshot file of ``state`` (the bytes :func:`snapshot_bytes` gives) straight to
    ``path``; returns its size. Why not ``snapshot_bytes`` then a write: serialising to a bytes
    object held a second full copy of the model in memory (and took as long as the write)."""
    from safetensors.torch import save_file

    meta = json.dumps({"digest": digest, "version": version}, sort_keys=True)
    save_file(dict(state), str(path), metadata={SNAPSHOT_METADATA_KEY: meta})
    return path.stat().st_size


def file_digest(path: Path) -> str:
    """``sha256:<hex>`` of a file, read in chunks (from the page cache, just written)."""
    import hashlib

    with open(path, "rb") as f:
        return DIGEST_PREFIX + hashlib.file_digest(f, "sha256").hexdigest()


def check_policy(policy: str) -> str:
    if not isinstance(policy, str) or not _POLICY_RE.match(policy):
        raise WeightStoreError(
            f"invalid policy name {policy!r}: expected 1-128 letters, digits, '_', '.' or '-'"
        )
    return policy


def _cpu_state(tensors: Mapping[str, Any]) -> dict[str, Any]:
    """A CPU copy: the trainer keeps updating its tensors in place after publishing."""
    return {n: t.detach().to("cpu", copy=True).contiguous() for n, t in tensors.items()}


class WeightStore:
    """Publish, list, read and garbage-collect weight versions under ``root``.

    The store keeps the last published state of each policy in memory (a CPU copy) so the next
    delta needs no disk read; a fresh store object falls back to the previous snapshot on disk.
    """

    def __init__(self, root: str | Path, location: str | None = None):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        #: What :class:`WeightVersion.location` announces (an URL when served over HTTP).
        self.location = location or str(self.root.resolve())
        self._last: dict[str, tuple[int, str, dict[str, Any]]] = {}

    # ----------------------------------------------------------------- paths
    def policy_dir(self, policy: str) -> Path:
        return self.root / check_policy(policy)

    def version_dir(self, policy: str, version: int) -> Path:
        if not isinstance(version, int) or version < 0:
            raise WeightStoreError(f"version must be an integer >= 0, got {version!r}")
        return self.policy_dir(policy) / f"v{version}"

    def full_path(self, policy: str, version: int) -> Path:
        path = self.version_dir(policy, version) / FULL_FILE
        if not path.is_file():
            raise WeightStoreError(f"policy {policy!r} has no version {version} in {self.root}")
        return path

    def delta_path(self, policy: str, version: int) -> Path | None:
        meta = self.meta(policy, version)
        name = meta.get("delta_file")
        return self.version_dir(policy, version) / name if name else None

    # ----------------------------------------------------------------- queries
    def versions(self, policy: str) -> list[int]:
        pdir = self.policy_dir(policy)
        if not pdir.is_dir():
            return []
        found = []
        for child in pdir.iterdir():
            m = _VERSION_RE.match(child.name)
            if m and (child / META_FILE).is_file():
                found.append(int(m.group(1)))
        return sorted(found)

    def meta(self, policy: str, version: int) -> dict[str, Any]:
        """The version's meta.json: WeightVersion fields plus ``full_sha256``/``delta_sha256``."""
        path = self.version_dir(policy, version) / META_FILE
        if not path.is_file():
            raise WeightStoreError(f"policy {policy!r} has no version {version} in {self.root}")
        return json.loads(path.read_text())

    def weight_version(self, policy: str, version: int) -> WeightVersion:
        """The stored version as announced *now*: at this store's location (a restarted trainer
        serves the same files from a new address)."""
        fields = WeightVersion.model_fields
        meta = {k: v for k, v in self.meta(policy, version).items() if k in fields}
        return WeightVersion(**{**meta, "location": self.location})

    def latest(self, policy: str) -> WeightVersion | None:
        versions = self.versions(policy)
        return self.weight_version(policy, versions[-1]) if versions else None

    def read_full(self, policy: str, version: int) -> bytes:
        return self.full_path(policy, version).read_bytes()

    def read_delta(self, policy: str, version: int) -> bytes | None:
        path = self.delta_path(policy, version)
        return path.read_bytes() if path is not None else None

    def load_state(self, policy: str, version: int) -> dict[str, Any]:
        from safetensors.torch import load_file

        return load_file(str(self.full_path(policy, version)))

    # ----------------------------------------------------------------- writes
    def publish(
        self, policy: str, version: int, tensors: Mapping[str, Any], *, copy: bool = True
    ) -> WeightVersion:
        """Write ``version`` (snapshot + delta from ``version - 1`` when that exists) atomically.

        ``copy=False``: ``tensors`` are already a private host copy (a
        :class:`~astraflow.weights.publisher.BackgroundPublisher` snapshot) that the store may
        keep as the base of the next delta; copying again would hold the model twice."""
        target = self.version_dir(policy, version)
        existing = self.versions(policy)
        state = _cpu_state(tensors) if copy else dict(tensors)
        digest = state_digest(state)
        if version in existing and self.meta(policy, version)["digest"] == digest:
            return self.weight_version(policy, version)  # a retried publish: nothing to do
        if existing and version <= existing[-1]:
            raise WeightStoreError(
                f"policy {policy!r} already has version {existing[-1]}; publish a higher version "
                f"than that, got {version} (a trainer resuming from an older checkpoint calls "
                f"discard_from(policy, {version}) first)"
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".v{version}.", dir=target.parent))
        try:
            return self._write_version(policy, version, state, digest, tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def _write_version(
        self, policy: str, version: int, state: dict[str, Any], digest: str, tmp: Path, target: Path
    ) -> WeightVersion:
        """Write the version's files under ``tmp``, then rename it to ``target`` (all or none)."""
        full_size = write_snapshot(tmp / FULL_FILE, state, digest, version)
        meta: dict[str, Any] = {
            "policy": policy,
            "version": version,
            "location": self.location,
            "digest": digest,
            "parent": None,
            "full_bytes": full_size,
            "full_sha256": file_digest(tmp / FULL_FILE),
            "delta_bytes": None,
            "delta_file": None,
            "delta_sha256": None,
        }
        previous = self._previous_state(policy, version - 1)
        delta_bytes = None
        if previous is not None:
            prev_digest, prev_state = previous
            delta = SparseDelta.compute(
                prev_state, state, old_digest=prev_digest, new_digest=digest
            )
            delta_bytes = delta.to_bytes()
            meta.update(
                parent=version - 1,
                delta_bytes=len(delta_bytes),
                delta_file=delta_file(version - 1),
                delta_sha256=bytes_digest(delta_bytes),
            )
        meta["created_at"] = time.time()
        if delta_bytes is not None:
            (tmp / meta["delta_file"]).write_bytes(delta_bytes)
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        os.rename(tmp, target)
        self._last[policy] = (version, digest, state)
        return self.weight_version(policy, version)

    def _previous_state(self, policy: str, version: int) -> tuple[str, dict[str, Any]] | None:
        cached = self._last.get(policy)
        if cached is not None and cached[0] == version:
            return cached[1], cached[2]
        if version < 0 or version not in self.versions(policy):
            return None
        return self.meta(policy, version)["digest"], self.load_state(policy, version)

    def discard_from(self, policy: str, version: int) -> list[int]:
        """Delete ``version`` and every newer one (a trainer restarting from an older checkpoint
        republishes them with new contents); returns the versions removed."""
        removed = [v for v in self.versions(policy) if v >= version]
        for v in removed:
            self._remove(policy, v)
        cached = self._last.get(policy)
        if cached is not None and cached[0] >= version:
            del self._last[policy]
        return removed

    def _remove(self, policy: str, version: int) -> None:
        vdir = self.version_dir(policy, version)
        trash = vdir.with_name(f".gc-{vdir.name}")
        os.rename(vdir, trash)  # disappear atomically, then delete
        shutil.rmtree(trash, ignore_errors=True)

    def gc(self, policy: str, keep: int) -> list[int]:
        """Delete all but the newest ``keep`` versions; returns the versions removed.

        A reader that already opened a file keeps reading it (POSIX unlink semantics)."""
        if keep < 1:
            raise WeightStoreError(f"gc must keep at least 1 version, got keep={keep}")
        versions = self.versions(policy)
        removed = versions[:-keep] if len(versions) > keep else []
        for v in removed:
            self._remove(policy, v)
        return removed
