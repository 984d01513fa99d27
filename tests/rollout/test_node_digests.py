"""A node that missed a whole rewind reloads: lease replies and heartbeats carry the digest of
each policy's latest version, and a node holding that version number with another digest
(retrained after a rewind while it was cut off) fetches the version again.

Real parts: the dataflow service and a trainer's weight server on loopback, a real node (scripted
engine and workflow) whose link to the service is cut by a real TCP relay while the timeline
rewinds and is retrained, and the real weight client fetching from the real store."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dataflow"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "weights"))

from dataflow_helpers import TOKEN, ThreadedService, make_recipe  # noqa: E402
from tcp_relay import TcpRelay  # noqa: E402
from test_node_leasing import NodeThread  # noqa: E402

from astraflow.protocol.client import SyncDataflowClient  # noqa: E402
from astraflow.weights import WeightClient, WeightStore, state_digest  # noqa: E402
from astraflow.weights.server import create_weight_app, serve_in_thread  # noqa: E402


def _state(seed: int) -> dict[str, torch.Tensor]:
    return {"w": torch.randn(64, 64, generator=torch.Generator().manual_seed(seed))}


def _wait(cond, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_a_node_that_missed_a_rewind_reloads_the_retrained_version(tmp_path):
    store = WeightStore(tmp_path / "weights")
    weights_url, stop_weights = serve_in_thread(create_weight_app(store, TOKEN))
    fetches: list[tuple[int | None, int, str]] = []  # (have, want, digest fetched)

    def fetch(policy: str, location: str, have: int | None, want: int):
        with WeightClient(location, TOKEN) as client:
            update = client.fetch_update(policy, have_version=have, want_version=want)
        fetches.append((have, want, update.digest))
        return update

    def announce(trainer: SyncDataflowClient, version: int) -> str:
        wv = store.weight_version("policy", version).model_copy(update={"location": weights_url})
        trainer.announce_version(wv)
        return wv.digest

    with (
        ThreadedService(make_recipe(tmp_path), tmp_path / "df.sqlite") as svc,
        SyncDataflowClient(svc.url, TOKEN) as trainer,
    ):
        for v, seed in ((1, 1), (2, 2)):
            store.publish("policy", v, _state(seed))
            first_v2 = announce(trainer, v)
        link = TcpRelay(svc.url)  # cut and healed below: a partition
        node = NodeThread(link.url, fetcher=fetch).start()
        try:
            _wait(lambda: node.engine.version == 2, "the node never loaded v2")
            assert fetches[-1][1:] == (2, first_v2)
            link.cut()  # the node is away while the trainer restarts from v1 and retrains v2
            store.discard_from("policy", 2)
            announce(trainer, 1)  # the rewind
            store.publish("policy", 2, _state(22))
            retrained_v2 = announce(trainer, 2)
            assert retrained_v2 != first_v2
            fetched_before = len(fetches)
            link.heal()
            _wait(
                lambda: len(fetches) > fetched_before,
                "the node kept its old v2 under the retrained v2's number",
            )
            # the whole snapshot: no delta leads from weights that are not the store's v1
            assert fetches[fetched_before] == (None, 2, retrained_v2)
            _wait(lambda: node.node._loaded.get("policy") == retrained_v2, "not loaded")
            assert node.engine.version == 2
            assert state_digest(_state(22)) == retrained_v2
        finally:
            node.stop()
            link.close()
            stop_weights()
