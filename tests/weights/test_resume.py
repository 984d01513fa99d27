"""An interrupted download resumes with a Range request instead of starting over.

A real TCP relay sits between the client and the real weight server and cuts the first response
after a fixed number of bytes, the way a dropped cross-region connection would.
"""

from __future__ import annotations

import socket
import threading

import torch

from astraflow.weights import WeightClient, WeightStore, state_digest
from astraflow.weights.server import create_weight_app, serve_in_thread

TOKEN = "resume-token"


class CuttingRelay:
    """Forwards TCP to ``upstream``; the first connection's response is cut after ``cut`` bytes
    (every connection's with ``every=True``: a link that keeps dropping long transfers)."""

    def __init__(self, upstream: tuple[str, int], cut: int, every: bool = False):
        self.upstream, self.cut, self.every = upstream, cut, every
        self.requests: list[bytes] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            limit = self.cut if self.connections == 1 or self.every else None
            threading.Thread(target=self._serve, args=(conn, limit), daemon=True).start()

    def _serve(self, conn: socket.socket, limit: int | None) -> None:
        up = socket.create_connection(self.upstream)

        def client_to_up():
            try:
                while data := conn.recv(65536):
                    self.requests.append(data)
                    up.sendall(data)
            except OSError:
                pass

        threading.Thread(target=client_to_up, daemon=True).start()
        sent = 0
        try:
            while data := up.recv(65536):
                if limit is not None and sent + len(data) > limit:
                    conn.sendall(data[: limit - sent])
                    break
                conn.sendall(data)
                sent += len(data)
        except OSError:
            pass
        finally:
            for s in (conn, up):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self) -> None:
        self._stop = True
        self.listener.close()


def test_cut_download_resumes_with_range(tmp_path):
    store = WeightStore(tmp_path)
    state = {"w": torch.randn(512, 512, generator=torch.Generator().manual_seed(0))}
    store.publish("p", 0, state)
    url, stop = serve_in_thread(create_weight_app(store, TOKEN))
    port = int(url.rsplit(":", 1)[1])
    relay = CuttingRelay(("127.0.0.1", port), cut=300_000)
    try:
        with WeightClient(f"http://127.0.0.1:{relay.port}", TOKEN, backoff=0.01) as client:
            # the meta request goes first over the same (first) connection and is small
            update = client.fetch_update("p", None, None)
        assert state_digest(update.full) == state_digest(state)
        heads = b"".join(relay.requests)
        assert b"Range: bytes=" in heads or b"range: bytes=" in heads
        assert relay.connections >= 2
    finally:
        relay.close()
        stop()


def test_a_transfer_cut_more_often_than_the_retry_budget_still_completes(tmp_path):
    """Each resumed request that brings bytes resets the retry count: a lossy link that cuts a
    large transfer many times slows it down but does not fail it."""
    store = WeightStore(tmp_path)
    state = {"w": torch.randn(512, 512, generator=torch.Generator().manual_seed(1))}
    store.publish("p", 0, state)
    size = store.meta("p", 0)["full_bytes"]
    url, stop = serve_in_thread(create_weight_app(store, TOKEN))
    port = int(url.rsplit(":", 1)[1])
    relay = CuttingRelay(("127.0.0.1", port), cut=120_000, every=True)
    try:
        with WeightClient(
            f"http://127.0.0.1:{relay.port}", TOKEN, backoff=0.01, retries=2
        ) as client:
            meta = client.meta("p", 0)
            full = client.fetch_full("p", 0, meta)
        assert state_digest(full) == state_digest(state)
        # more cut connections than the retry budget, each resumed where the last one broke
        assert relay.connections >= size // 120_000 > 2 + 1
        ranges = b"".join(relay.requests).lower().count(b"range: bytes=")
        assert ranges >= size // 120_000
    finally:
        relay.close()
        stop()
