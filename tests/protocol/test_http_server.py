"""The one uvicorn runner (``astraflow.protocol.http_server.HTTPServer``) in its three places: the
process's whole job (port file), a task of the caller's loop (signals left to the caller) and a
thread of its own (the trainer's weight server, IPv6 included). Real sockets on loopback."""

from __future__ import annotations

import asyncio
import signal
import socket

import httpx
import pytest
from fastapi import FastAPI

from astraflow.protocol.http_server import HTTPServer
from astraflow.weights import WeightStore
from astraflow.weights.server import create_weight_app, serve_in_thread


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/ping")
    def ping() -> dict:
        return {"pong": True}

    return app


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_serve_writes_the_port_file_once_listening(tmp_path):
    port_file = tmp_path / "run" / "service.url"

    async def main() -> tuple[str, dict]:
        server = HTTPServer(_app())
        task = asyncio.create_task(server.serve(port_file))
        while not port_file.exists():
            await asyncio.sleep(0.01)
        url = port_file.read_text()
        async with httpx.AsyncClient() as client:
            body = (await client.get(url + "/ping")).json()
        server.server.should_exit = True
        await task
        return url, body

    url, body = asyncio.run(main())
    assert url.startswith("http://127.0.0.1:") and body == {"pong": True}


def test_a_server_on_the_callers_loop_leaves_the_signals_to_the_caller():
    async def main() -> tuple[object, object, dict]:
        before = signal.getsignal(signal.SIGTERM)
        server = await HTTPServer(_app(), lifespan="off").start()
        assert server.loop is asyncio.get_running_loop()
        during = signal.getsignal(signal.SIGTERM)  # uvicorn would install its own here
        async with httpx.AsyncClient() as client:
            body = (await client.get(server.url + "/ping")).json()
        await server.stop()
        return before, during, body

    before, during, body = asyncio.run(main())
    assert during is before and body == {"pong": True}


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback (::1) on this machine")
def test_the_weight_server_serves_on_ipv6(tmp_path):
    url, stop = serve_in_thread(create_weight_app(WeightStore(tmp_path), "tok"), host="::1")
    try:
        assert url.startswith("http://[::1]:")
        assert httpx.get(url + "/healthz", timeout=10).status_code == 200
    finally:
        stop()


def test_a_thread_server_stops_and_closes_its_socket():
    with HTTPServer(_app(), lifespan="off") as server:
        assert httpx.get(server.url + "/ping", timeout=10).json() == {"pong": True}
    with pytest.raises(httpx.ConnectError):  # nothing listens there any more
        httpx.get(server.url + "/ping", timeout=10)
