"""Region-local weight cache: real weight server, real cache server, real clients (loopback HTTP)."""

from __future__ import annotations

import threading

import httpx
import pytest
import torch

from astraflow.weights import WeightClient, WeightStore, WeightTransferError, state_digest
from astraflow.weights.cache import WeightCache, create_cache_app, parse_upstreams
from astraflow.weights.server import create_weight_app, serve_in_thread

TOKEN = "cache-test-token"


def _states(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    states = [{"w": torch.randn(256, 256, generator=g).to(torch.bfloat16)}]
    for _ in range(n - 1):
        w = states[-1]["w"].float() + 1e-2 * torch.randn(256, 256, generator=g)
        states.append({"w": w.to(torch.bfloat16)})
    return states


@pytest.fixture
def region(tmp_path):
    store = WeightStore(tmp_path / "store")
    states = _states(3)
    for v, s in enumerate(states):
        store.publish("p", v, s)
    up_url, stop_up = serve_in_thread(create_weight_app(store, TOKEN))
    cache = WeightCache({"*": up_url}, TOKEN, tmp_path / "cache")
    url, stop = serve_in_thread(create_cache_app(cache))
    yield url, cache, store, states, up_url
    stop()
    cache.close()
    stop_up()


def test_nodes_of_a_region_share_one_download_per_file(region):
    url, cache, _, states, _ = region
    results, errors = [], []
    barrier = threading.Barrier(4)

    def node():
        try:
            with WeightClient(url, TOKEN) as client:
                barrier.wait()
                results.append(client.fetch_update("p", None, None, want_version=2))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=node) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert all(state_digest(r.full) == state_digest(states[2]) for r in results)
    stats = cache.snapshot()
    assert stats.files_fetched == 1  # one copy crossed "the link" for four nodes
    assert stats.hits + stats.coalesced == 3 and stats.files_served == 4
    # a delta is a different file: fetched once too, then served from the cache
    for _ in range(2):
        with WeightClient(url, TOKEN) as client:
            upd = client.fetch_update("p", 1, state_digest(states[1]), want_version=2)
            assert upd.delta is not None
    assert cache.snapshot().files_fetched == 2


def test_cache_needs_the_run_token(region):
    url, *_ = region
    assert httpx.get(f"{url}/healthz").status_code == 200
    for path in ("/weights/p/latest", "/weights/p/1/full", "/cache/stats"):
        assert httpx.get(url + path).status_code == 401
        assert httpx.get(url + path, headers={"Authorization": "Bearer no"}).status_code == 401
    with pytest.raises(WeightTransferError, match="token"):
        WeightClient(url, "wrong", retries=0).fetch_update("p", None, None)


def test_range_requests_are_served_from_the_cache(region):
    url, cache, store, _, _ = region
    headers = {"Authorization": f"Bearer {TOKEN}", "Range": "bytes=100-199"}
    r = httpx.get(f"{url}/weights/p/1/full", headers=headers)
    assert r.status_code == 206 and r.content == store.read_full("p", 1)[100:200]


def test_a_republished_version_is_a_different_file(region):
    """A trainer resuming from an older checkpoint republishes a version with new contents: the
    cache names files by sha256, so it never serves the discarded contents."""
    url, cache, store, states, _ = region
    with WeightClient(url, TOKEN) as client:
        assert state_digest(client.fetch_full("p", 2)) == state_digest(states[2])
    store.discard_from("p", 2)
    other = _states(3, seed=9)[2]
    store.publish("p", 2, other)
    with WeightClient(url, TOKEN) as client:
        assert state_digest(client.fetch_full("p", 2)) == state_digest(other)


def test_missing_versions_and_unreachable_upstreams(region, tmp_path):
    url, *_ = region
    with WeightClient(url, TOKEN, retries=0) as client:
        assert client.meta("nope") is None
        with pytest.raises(Exception, match="no version 7"):
            client.meta("p", 7)
    dead = WeightCache({"*": "http://127.0.0.1:9"}, TOKEN, tmp_path / "dead", retries=0)
    dead_url, stop = serve_in_thread(create_cache_app(dead))
    try:
        with WeightClient(dead_url, TOKEN, retries=1, backoff=0.01) as client:
            with pytest.raises(WeightTransferError, match="502|server error"):
                client.fetch_update("p", None, None)
    finally:
        stop()
        dead.close()


def test_parse_upstreams():
    assert parse_upstreams(["http://a:1/"]) == {"*": "http://a:1"}
    assert parse_upstreams(["solver=http://a:1", "http://b:2"]) == {
        "solver": "http://a:1",
        "*": "http://b:2",
    }
    for bad in ([], ["ftp://x"], ["p=http://a", "p=http://b"], ["bad name=http://a"]):
        with pytest.raises(ValueError):
            parse_upstreams(bad)


def test_a_snapshot_is_rebuilt_from_cached_deltas_not_downloaded(tmp_path):
    """Nodes of a region ask for different files: one up to date wants v -> v+1's delta, one that
    joined late wants the snapshot. After its first snapshot the cache downloads only deltas and
    rebuilds the snapshots from them (byte for byte the trainer's file, checked by sha256)."""
    store = WeightStore(tmp_path / "store")
    states = _states(5, seed=4)
    for v, s in enumerate(states):
        store.publish("p", v, s)
    up_url, stop_up = serve_in_thread(create_weight_app(store, TOKEN))
    cache = WeightCache({"*": up_url}, TOKEN, tmp_path / "cache")
    url, stop = serve_in_thread(create_cache_app(cache))
    try:
        with WeightClient(url, TOKEN) as early, WeightClient(url, TOKEN) as late:
            held = early.fetch_full("p", 1)  # the first snapshot: downloaded
            digest = state_digest(held)
            for v in (2, 3, 4):  # an up-to-date node follows by delta
                upd = early.fetch_update("p", v - 1, digest, want_version=v)
                assert upd.delta is not None
                upd.delta.apply_(held)
                digest = upd.digest
            assert cache.snapshot().files_fetched == 4
            # a node joining now asks for the snapshot of v4: rebuilt here, nothing downloaded
            full = late.fetch_full("p", 4)
            assert state_digest(full) == state_digest(states[4]) == digest
        stats = cache.snapshot()
        assert stats.files_fetched == 4 and stats.files_rebuilt == 1
        assert stats.rebuild_mismatches == 0
    finally:
        stop()
        cache.close()
        stop_up()


@pytest.mark.slow
def test_snapshot_files_are_the_same_bytes_in_every_process(tmp_path):
    """The cache's rebuilt snapshot must hash like the trainer's: one metadata key (safetensors
    writes several in an order that differs between processes)."""
    import subprocess
    import sys

    code = (
        "import torch, hashlib; from astraflow.weights.store import snapshot_bytes; "
        "s = {n: torch.ones(3, dtype=d) for n, d in (('b', torch.float32), ('a', torch.bfloat16),"
        " ('c', torch.int64))}; print(hashlib.sha256(snapshot_bytes(s, 'sha256:x', 7)).hexdigest())"
    )
    digests = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()
        for _ in range(3)
    }
    assert len(digests) == 1


def test_a_snapshot_is_downloaded_when_its_missing_deltas_weigh_more(region):
    """Rebuilding pays only if the deltas still to download are smaller than the snapshot (here
    every element changes each version, so each delta is about a snapshot)."""
    url, cache, _, states, _ = region
    with WeightClient(url, TOKEN) as client:
        client.fetch_full("p", 0)  # the base
        assert state_digest(client.fetch_full("p", 2)) == state_digest(states[2])
    stats = cache.snapshot()
    assert stats.files_fetched == 2 and stats.files_rebuilt == 0
