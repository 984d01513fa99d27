"""The one way the project runs an HTTP server: uvicorn on a socket bound here (IPv4 or IPv6).

:class:`HTTPServer` serves an ASGI app in one of three places, the only difference between the
project's servers:

* as the process's whole job (:func:`run` / :meth:`HTTPServer.serve`): the dataflow service
  (:mod:`astraflow.dataflow.main`), a region's weight cache (``astraflow serve weight-cache``) and
  the policy server (``astraflow serve policy``); uvicorn handles SIGINT/SIGTERM;
* as a task of the caller's running event loop (:meth:`HTTPServer.start` / :meth:`stop`): the rollout
  node's agent gateway, whose endpoints drive engines that belong to that loop; the caller owns
  the signals;
* in a daemon thread with a loop of its own (:meth:`HTTPServer.start_in_thread`, or ``with``): the
  trainer's weight server beside training (:func:`astraflow.weights.server.serve_in_thread`) and
  tests.

Why in ``protocol``, beside the client and the TLS settings: no component should import another one
to start a server. The socket is bound before the server starts, so ``port=0`` yields a free port
whose URL is known at once (:attr:`HTTPServer.url`). A launcher starts a service with ``port = 0``
and reads ``http(s)://host:port`` from the port file, which appears only once the socket is
listening (written atomically, so a reader never sees half). Given a
:class:`~astraflow.protocol.tls.ServerTLS`, the server speaks HTTPS and the URL says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Literal

import uvicorn

from astraflow.errors import AstraFlowError
from astraflow.protocol.slow_clients import (
    BODY_IDLE_TIMEOUT_S,
    HEADER_TIMEOUT_S,
    MAX_PENDING_PER_CLIENT,
    guarded,
)
from astraflow.protocol.tls import ServerTLS

#: How often startup is polled: uvicorn offers no event to await until it listens.
_STARTUP_POLL_S = 0.01


class PortUnavailable(AstraFlowError, OSError):
    """The address to listen on cannot be had: said in one line with what to do, because a
    51-line traceback ending in ``[Errno 98]`` tells a user neither."""


_BIND_HINTS = {
    errno.EADDRINUSE: "the port is in use (another service or program listens on it)",
    errno.EACCES: "ports below 1024 need root",
    errno.EADDRNOTAVAIL: "the host is not an address of this machine",
}


def bind_socket(host: str, port: int) -> socket.socket:
    if not 0 <= port <= 65535:
        raise PortUnavailable(f"cannot listen on port {port}: a port is 0 (a free one) to 65535")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        why = _BIND_HINTS.get(exc.errno, exc.strerror or str(exc))
        raise PortUnavailable(
            f"cannot listen on {url_for(host, port)}: {why}; pick another port, or 0 for a free one"
        ) from exc
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def write_port_file(path: Path, url: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(url)
    os.replace(tmp, path)


#: seconds a stopping server lets running requests finish before cancelling them
GRACEFUL_SHUTDOWN_S = 3.0


def url_for(host: str, port: int, tls: bool = False) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"{'https' if tls else 'http'}://{shown}:{port}"


class GracefulServer(uvicorn.Server):
    """uvicorn's server, except that a shutdown asked for by SIGTERM/SIGINT ends the process with
    status 0 once it completed.

    uvicorn re-raises the signal after its graceful shutdown, so every service a launcher stopped
    at the end of a run (or after ``POST /run/stop``) exited -15 although nothing went wrong; a
    second signal during the shutdown still ends it at once, as uvicorn's own handler does."""

    @contextlib.contextmanager
    def capture_signals(self):
        with super().capture_signals():
            try:
                yield
            finally:
                self._captured_signals.clear()


class HTTPServer:
    """uvicorn serving ``app`` on ``host:port`` (bound on construction; ``port=0``: a free port).

    ``lifespan="on"`` runs the app's startup and shutdown handlers (the dataflow service opens and
    closes its store there); ``"off"`` for apps without any. ``name`` names the thread or task.
    """

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        tls: ServerTLS | None = None,
        log_level: str = "warning",
        lifespan: Literal["on", "off", "auto"] = "auto",
        name: str = "http-server",
        header_timeout_s: float = HEADER_TIMEOUT_S,
        body_idle_timeout_s: float = BODY_IDLE_TIMEOUT_S,
        max_pending_per_client: int = MAX_PENDING_PER_CLIENT,
    ) -> None:
        self.sock = bind_socket(host, port)
        self.host = host
        self.port: int = self.sock.getsockname()[1]
        self.url = url_for(host, self.port, tls is not None)
        self.name = name
        config = uvicorn.Config(
            app,
            log_level=log_level,
            access_log=False,
            lifespan=lifespan,
            loop="none",
            # uvicorn's httptools protocol plus header/body read timeouts and a per-client cap
            # on connections still sending a request (slow clients: issue 48 #7)
            http=guarded(header_timeout_s, body_idle_timeout_s, max_pending_per_client),
            timeout_keep_alive=30,
            # On shutdown, requests still running after this are cancelled: a long poll whose
            # caller has gone (a stopped trainer's batch request) would otherwise hold the exit
            # for its whole wait, and the launcher SIGKILLs a service that does not stop in time.
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
            backlog=2048,
            **(tls.uvicorn_kwargs() if tls else {}),
        )
        self.server = GracefulServer(config)
        #: the event loop serving (set by :meth:`start`; None in the other modes)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._thread: threading.Thread | None = None

    # -------------------------------------------------------------- the process's whole job

    async def serve(
        self, port_file: Path | None = None, on_listening: Callable[[str], None] | None = None
    ) -> None:
        """Serve until SIGINT/SIGTERM (uvicorn's handlers) or :attr:`server` ``.should_exit``;
        once the socket listens, ``port_file`` gets the URL and ``on_listening`` is called with it."""

        async def announce() -> None:
            while not self.server.started:
                if self.server.should_exit:
                    return
                await asyncio.sleep(_STARTUP_POLL_S)
            if port_file is not None:
                write_port_file(port_file, self.url)
            if on_listening is not None:
                on_listening(self.url)

        task = asyncio.create_task(announce())
        try:
            await self.server.serve(sockets=[self.sock])
        finally:
            task.cancel()
            self.sock.close()

    # -------------------------------------------------------------- a task of the caller's loop

    async def start(self, timeout: float = 30.0) -> HTTPServer:
        """Serve as a task of the running loop; returns once the socket listens. The caller owns
        SIGINT/SIGTERM: uvicorn's signal handlers are not installed."""
        self.loop = asyncio.get_running_loop()
        self.server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
        self._task = asyncio.create_task(self.server.serve(sockets=[self.sock]), name=self.name)
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if self._task.done() or time.monotonic() > deadline:
                error = self._task.exception() if self._task.done() else None
                raise RuntimeError(f"{self.name} did not start on {self.url}") from error
            await asyncio.sleep(_STARTUP_POLL_S)
        return self

    async def stop(self, timeout: float = 10.0) -> None:
        """End a server started with :meth:`start` (cancelled if it does not stop in time)."""
        if self._task is None:
            return
        self.server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout=timeout)
        except (TimeoutError, asyncio.CancelledError):
            self._task.cancel()
        self._task = None
        self.sock.close()

    # -------------------------------------------------------------- a thread of its own

    def start_in_thread(self, timeout: float = 30.0) -> HTTPServer:
        """Serve in a daemon thread with its own event loop; returns once the socket listens."""
        self._thread = threading.Thread(
            target=lambda: _run_on_new_loop(self.server.serve(sockets=[self.sock])),
            name=self.name,
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.server.should_exit = True
                self.sock.close()
                raise RuntimeError(f"{self.name} did not start on {self.url}")
            time.sleep(_STARTUP_POLL_S)
        return self

    def stop_thread(self, timeout: float = 10.0) -> None:
        """End a server started with :meth:`start_in_thread` (waits up to ``timeout``)."""
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self.sock.close()

    def __enter__(self) -> HTTPServer:
        return self.start_in_thread()

    def __exit__(self, *exc: object) -> None:
        self.stop_thread()


async def serve(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    port_file: Path | None = None,
    log_level: str = "warning",
    tls: ServerTLS | None = None,
    on_listening: Callable[[str], None] | None = None,
) -> None:
    """:meth:`HTTPServer.serve` on the running loop; once listening, write ``port_file`` and call
    ``on_listening`` with the URL (the real port, also when ``port`` is 0)."""
    await HTTPServer(app, host, port, tls=tls, log_level=log_level).serve(port_file, on_listening)


def run(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    port_file: Path | None = None,
    log_level: str = "warning",
    tls: ServerTLS | None = None,
    on_listening: Callable[[str], None] | None = None,
) -> None:
    """:func:`serve` on a fresh event loop (the process's whole job)."""
    _run_on_new_loop(serve(app, host, port, port_file, log_level, tls, on_listening))


def _run_on_new_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on a new uvloop loop (asyncio's own when uvloop is missing)."""
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop comes with uvicorn[standard]
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main)
