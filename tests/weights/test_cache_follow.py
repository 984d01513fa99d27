"""The region weight cache follows the run's version table to a restarted trainer's new weight
server, and streams a file to its nodes while the file is still crossing the slow link.

Real parts: a real dataflow service, real weight servers and cache servers on loopback, real
clients; the slow link is a real TCP relay that holds the upstream's bytes until the test lets
them through."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import torch
from tcp_relay import TcpRelay

from astraflow.protocol.auth import derive_token
from astraflow.protocol.client import SyncDataflowClient
from astraflow.weights import WeightClient, WeightStore, state_digest
from astraflow.weights.cache import WeightCache, create_cache_app
from astraflow.weights.digest import bytes_digest
from astraflow.weights.server import create_weight_app, serve_in_thread

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dataflow"))
from dataflow_helpers import TOKEN, ThreadedService, make_recipe  # noqa: E402

NODE = derive_token(TOKEN, "node")
TRAINER = derive_token(TOKEN, "trainer")


def _state(seed: int, n: int = 256) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(n, n, generator=g).to(torch.bfloat16)}


def _publish(store: WeightStore, dataflow: SyncDataflowClient, version: int, url: str, state):
    wv = store.publish("policy", version, state)
    dataflow.announce_version(wv.model_copy(update={"location": url}))


def test_the_cache_follows_a_restarted_trainer_to_its_new_port(tmp_path):
    store = WeightStore(tmp_path / "store")
    states = [_state(s) for s in range(3)]
    with (
        ThreadedService(make_recipe(tmp_path), tmp_path / "df.sqlite") as df,
        SyncDataflowClient(df.url, TRAINER) as trainer,
    ):
        first_url, stop_first = serve_in_thread(create_weight_app(store, TOKEN))
        for v in (0, 1):
            _publish(store, trainer, v, first_url, states[v])
        # no --upstream: the cache learns where the weights are from the version table
        cache = WeightCache({}, NODE, tmp_path / "cache", dataflow=df.url, retries=1)
        cache_url, stop_cache = serve_in_thread(create_cache_app(cache))
        try:
            with WeightClient(cache_url, NODE) as node:
                got = node.fetch_update("policy", None, None, want_version=1)
                assert state_digest(got.full) == state_digest(states[1])
            # the trainer restarts: its weight server comes back on another port
            stop_first()
            second_url, stop_second = serve_in_thread(create_weight_app(store, TOKEN))
            assert second_url != first_url
            try:
                _publish(store, trainer, 2, second_url, states[2])
                with WeightClient(cache_url, NODE) as node:
                    got = node.fetch_update("policy", 1, state_digest(states[1]), want_version=2)
                    assert got.version == 2 and state_digest(got.full) == state_digest(states[2])
                stats = cache.snapshot()
                assert stats.upstreams == {"policy": second_url}
                assert stats.upstream_changes == 2  # first learned, then moved
            finally:
                stop_second()
        finally:
            stop_cache()
            cache.close()


def test_a_node_gets_the_first_bytes_before_the_cache_has_the_whole_file(tmp_path):
    store = WeightStore(tmp_path / "store")
    store.publish("policy", 0, _state(0, n=1024))  # a 2 MiB snapshot
    up_url, stop_up = serve_in_thread(create_weight_app(store, TOKEN))
    link = TcpRelay(up_url, hold_after=256 * 1024)  # a link slower than the test waits for
    cache = WeightCache({"*": link.url}, NODE, tmp_path / "cache")
    cache_url, stop_cache = serve_in_thread(create_cache_app(cache))
    expected = store.read_full("policy", 0)
    try:
        headers = {"Authorization": f"Bearer {NODE}"}
        with httpx.stream(
            "GET", f"{cache_url}/weights/policy/0/full", headers=headers, timeout=20
        ) as resp:
            assert resp.status_code == 200
            assert int(resp.headers["content-length"]) == len(expected)
            chunks = resp.iter_bytes()
            first = next(chunks)  # arrives while the link still holds most of the file
            assert first and expected.startswith(first)
            assert len(first) < len(expected)
            assert cache.snapshot().files_fetched == 0 and cache.snapshot().streamed == 1
            link.release()
            body = first + b"".join(chunks)
        assert bytes_digest(body) == bytes_digest(expected)
        stats = cache.snapshot()
        assert stats.files_fetched == 1 and stats.cached_files == 1
        # a node that asks afterwards is served the verified copy from disk
        with WeightClient(cache_url, NODE) as node:
            assert state_digest(node.fetch_full("policy", 0)) == state_digest(_state(0, n=1024))
        assert cache.snapshot().hits == 1
    finally:
        link.close()
        stop_cache()
        cache.close()
        stop_up()
