"""A TCP proxy in front of a server (the tests' S3 server), that can be made to refuse
connections for a while: `down()` closes its listening socket (a client's connect is refused,
as from an endpoint that is away) and cuts the connections it carries; `up()` listens again on
the same port. What a store that goes away for a while looks like to its clients."""

from __future__ import annotations

import socket
import threading
from typing import Optional


class Proxy:
    def __init__(self, target: tuple[str, int], host: str = "127.0.0.1"):
        self.target, self.host = target, host
        self._listener: Optional[socket.socket] = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        with socket.socket() as s:
            s.bind((host, 0))
            self.port = s.getsockname()[1]
        self.up()

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, self.port))
        listener.listen(128)
        with self._lock:
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            carried, self._open = self._open, set()
        if listener is not None:
            listener.close()
        for s in carried:
            _close(s)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed: down()
            try:
                server = socket.create_connection(self.target)
            except OSError:
                _close(client)
                continue
            with self._lock:
                if self._listener is not listener:  # went down meanwhile
                    _close(client)
                    _close(server)
                    continue
                self._open |= {client, server}
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open -= {a, b}
            _close(a)
            _close(b)


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()
