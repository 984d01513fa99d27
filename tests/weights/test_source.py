"""The ``WeightSource`` interface: the client's decision rule and byte checks work the same over
any backend, the two built-in ones (HTTP, directory) and one written here against the interface."""

from __future__ import annotations

import pytest
import torch

from astraflow.weights import (
    DirectoryWeightSource,
    HTTPWeightSource,
    WeightClient,
    WeightSource,
    WeightStore,
    WeightStoreError,
    WeightTransferError,
)
from astraflow.weights.source import open_weight_source


class RecordingSource:
    """A third-party backend: serves a store's files from memory, can corrupt one on purpose."""

    def __init__(self, store: WeightStore) -> None:
        self.location = "memory://test"
        self.inner = DirectoryWeightSource(store.root)
        self.reads: list[tuple[int, str]] = []
        self.corrupt: tuple[int, str] | None = None

    def meta(self, policy, version=None):
        return self.inner.meta(policy, version)

    def read(self, policy, version, kind, size):
        self.reads.append((version, kind))
        data = self.inner.read(policy, version, kind, size)
        if self.corrupt == (version, kind):
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        return data

    def close(self):
        pass


@pytest.fixture
def store(tmp_path):
    store = WeightStore(tmp_path / "store")
    state = {"w": torch.zeros(4096), "b": torch.ones(3)}
    for v in range(3):
        state = {"w": state["w"].clone(), "b": state["b"] + v}
        state["w"][v * 7] = float(v + 1)  # a few changed elements: deltas are small
        store.publish("solver", v, state)
    return store


def test_a_source_written_against_the_interface_gets_deltas_and_snapshots(store):
    source = RecordingSource(store)
    assert isinstance(source, WeightSource)
    client = WeightClient(source)
    assert client.source == "memory://test"
    update = client.fetch_update("solver", have_version=0, want_version=2)
    assert update.delta is not None and source.reads == [(1, "delta"), (2, "delta")]
    source.reads.clear()
    full = client.fetch_update("solver", have_version=None, want_version=2)
    assert full.full is not None and source.reads == [(2, "full")]
    assert torch.equal(full.full["b"], store.load_state("solver", 2)["b"])


def test_the_client_rejects_corrupt_bytes_from_any_source(store):
    source = RecordingSource(store)
    source.corrupt = (2, "full")
    with pytest.raises(WeightTransferError, match="full of solver v2 is corrupt"):
        WeightClient(source).fetch_update("solver", have_version=None)


def test_urls_and_directories_open_the_built_in_backends(store, tmp_path):
    assert isinstance(open_weight_source(store.root), DirectoryWeightSource)
    http = open_weight_source("http://127.0.0.1:9/", "tok")
    assert isinstance(http, HTTPWeightSource) and http.location == "http://127.0.0.1:9/"
    http.close()
    with pytest.raises(WeightStoreError, match="neither an http\\(s\\) URL nor a directory"):
        WeightClient(tmp_path / "missing")
