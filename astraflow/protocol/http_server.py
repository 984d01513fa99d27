"""Run an ASGI app under uvicorn on a socket bound here; optionally write its URL to a port file.

The processes whose whole job is one HTTP server run this way: the dataflow service
(:mod:`astraflow.dataflow.main`), a region's weight cache (``astraflow serve weight-cache``) and the
policy server (``astraflow serve policy``); the trainer's weight server runs in a thread beside
training instead (:func:`astraflow.weights.server.serve_in_thread`). Why in ``protocol``, beside
the client and the TLS settings: no component should import another one to start a server.

A launcher starts a service with ``port = 0`` and reads ``http(s)://host:port`` from the port file,
which appears only once the socket is listening (written atomically, so a reader never sees half).
Given a :class:`~astraflow.protocol.tls.ServerTLS`, the server speaks HTTPS and the URL says so.
"""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from astraflow.protocol.tls import ServerTLS


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def write_port_file(path: Path, url: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(url)
    os.replace(tmp, path)


def url_for(host: str, port: int, tls: bool = False) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"{'https' if tls else 'http'}://{shown}:{port}"


async def serve(
    app: FastAPI,
    host: str = "127.0.0.1",
    port: int = 0,
    port_file: Path | None = None,
    log_level: str = "warning",
    tls: ServerTLS | None = None,
) -> None:
    sock = bind_socket(host, port)
    actual = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        log_level=log_level,
        access_log=False,
        loop="none",
        http="httptools",
        timeout_keep_alive=30,
        backlog=2048,
        **(tls.uvicorn_kwargs() if tls else {}),
    )
    server = uvicorn.Server(config)

    async def announce() -> None:
        while not server.started:
            if server.should_exit:
                return
            await asyncio.sleep(0.02)
        if port_file is not None:
            write_port_file(port_file, url_for(host, actual, tls is not None))

    task = asyncio.create_task(announce())
    try:
        await server.serve(sockets=[sock])
    finally:
        task.cancel()


def run(
    app: FastAPI,
    host: str = "127.0.0.1",
    port: int = 0,
    port_file: Path | None = None,
    log_level: str = "warning",
    tls: ServerTLS | None = None,
) -> None:
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop comes with uvicorn[standard]
        factory = None
    if factory is not None and hasattr(asyncio, "Runner"):  # Python >= 3.11
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(serve(app, host, port, port_file, log_level, tls))
    else:
        asyncio.run(serve(app, host, port, port_file, log_level, tls))
