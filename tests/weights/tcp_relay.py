"""A real TCP relay on loopback standing for a network link a test controls.

One relay for every test that needs a bad link between a client and a real server: a partition
(:meth:`TcpRelay.cut` / :meth:`TcpRelay.heal`), a slow link that holds a response after its first
bytes (``hold_after``, :meth:`TcpRelay.release`), and a link that drops long transfers
(``cut_after``: the first response, or every one, ends after that many bytes). The kernel's own
TCP carries the bytes; nothing in the client or the server is replaced.
"""

from __future__ import annotations

import socket
import threading


class TcpRelay:
    """Forwards TCP from ``self.url`` to ``target`` (``"http://host:port"`` or ``(host, port)``).

    ``hold_after``: each response passes its first ``hold_after`` bytes, the rest waits for
    :meth:`release`. ``cut_after``: the first response (every response with ``cut_every``) ends
    after ``cut_after`` bytes, both sockets closed. Requests are kept in :attr:`requests` and
    accepted connections counted in :attr:`connections`."""

    def __init__(
        self,
        target: str | tuple[str, int],
        *,
        hold_after: int | None = None,
        cut_after: int | None = None,
        cut_every: bool = False,
    ) -> None:
        if isinstance(target, str):
            host, port = target.removeprefix("http://").split(":")
            target = (host, int(port))
        self.target = target
        self.hold_after, self.cut_after, self.cut_every = hold_after, cut_after, cut_every
        self.requests: list[bytes] = []
        self.connections = 0
        self.released = threading.Event()
        self.cut_off = threading.Event()
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    # -- what a test does to the link ------------------------------------------------------------
    def cut(self) -> None:
        """A partition: every open connection is dropped, new ones are closed at once."""
        self.cut_off.set()
        self._drop_open()

    def heal(self) -> None:
        self.cut_off.clear()

    def release(self) -> None:
        """Let held responses through (``hold_after``)."""
        self.released.set()

    def close(self) -> None:
        self.release()
        self.listener.close()
        self._drop_open()

    # -- the relay -------------------------------------------------------------------------------
    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.cut_off.is_set():
                client.close()
                continue
            self.connections += 1
            cut = self.cut_after if self.connections == 1 or self.cut_every else None
            server = socket.create_connection(self.target)
            with self._lock:
                self._open += [client, server]
            threading.Thread(target=self._requests, args=(client, server), daemon=True).start()
            threading.Thread(
                target=self._responses, args=(server, client, cut), daemon=True
            ).start()

    def _requests(self, client: socket.socket, server: socket.socket) -> None:
        try:
            while data := client.recv(65536):
                self.requests.append(data)
                server.sendall(data)
        except OSError:
            pass
        finally:
            _shutdown(server, socket.SHUT_WR)

    def _responses(self, server: socket.socket, client: socket.socket, cut: int | None) -> None:
        sent = 0
        try:
            while data := server.recv(65536):
                if cut is not None and sent + len(data) > cut:
                    client.sendall(data[: cut - sent])
                    break
                if self.hold_after is not None and sent + len(data) > self.hold_after:
                    room = max(0, self.hold_after - sent)
                    client.sendall(data[:room])
                    sent += room
                    self.released.wait()
                    data = data[room:]
                client.sendall(data)
                sent += len(data)
        except OSError:
            pass
        finally:
            for s in (client, server):
                _shutdown(s, socket.SHUT_RDWR)
                s.close()

    def _drop_open(self) -> None:
        with self._lock:
            conns, self._open = self._open, []
        for s in conns:
            _shutdown(s, socket.SHUT_RDWR)
            s.close()


def _shutdown(s: socket.socket, how: int) -> None:
    try:
        s.shutdown(how)
    except OSError:
        pass
