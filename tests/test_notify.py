"""notify.webhook against real misbehaving HTTP servers on loopback (issue 26, item 7): one
deadline for the whole call, redirects neither followed nor counted as delivered (and no
credentials sent to another host), the answer's size capped; credentials never stored."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DEBUG, run_cli
from tuner.driver.notify import post

PAYLOAD = {"name": "s", "status": "completed"}


class RawServer:
    """A TCP server on loopback that reads one HTTP request, then answers with `answer(conn)`
    (which may take its time); counts the bytes it managed to send."""

    def __init__(self, answer: Callable[[socket.socket, RawServer], None]):
        self.answer, self.sent, self.requests = answer, 0, 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(
                next(
                    ln.split(b":")[1]
                    for ln in head.lower().split(b"\r\n")
                    if ln.startswith(b"content-length")
                )
            )
            while len(body) < length:
                body += conn.recv(65536)
            self.requests += 1
            try:
                self.answer(conn, self)
            except OSError:  # the client hung up: what this server wants to see
                pass

    def send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(data)
        self.sent += len(data)

    def close(self) -> None:
        self.stop.set()
        # shutdown wakes the accept() of the serving thread (close alone leaves it blocked,
        # and the thread alive, for the rest of the test session)
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


@pytest.fixture
def raw_server() -> Iterator[Callable[..., RawServer]]:
    made: list[RawServer] = []

    def make(answer: Callable[[socket.socket, RawServer], None]) -> RawServer:
        made.append(RawServer(answer))
        return made[-1]

    yield make
    for s in made:
        s.close()


TRICKLE_S = 30.0  # how long a trickling server goes on: what a per-read timeout would wait


def _trickle(
    where: str, every_s: float = 0.5, for_s: float = TRICKLE_S
) -> Callable[[socket.socket, RawServer], None]:
    """An answer that trickles one byte every `every_s` seconds (for `for_s` at most), in its
    status line and headers, or in its body."""

    def answer(conn: socket.socket, server: RawServer) -> None:
        head = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n"
        if where == "body":
            server.send(conn, head)
        end = time.monotonic() + for_s
        while time.monotonic() < end and not server.stop.is_set():
            server.send(conn, head[:1] if where == "headers" else b"x")
            head = head[1:] or b"x"
            time.sleep(every_s)

    return answer


@pytest.mark.parametrize("where", ["headers", "body"])
def test_a_trickling_server_gets_one_deadline_for_the_whole_call(
    raw_server: Callable[..., RawServer], where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    server = raw_server(_trickle(where))
    began = time.monotonic()
    assert not post(f"http://127.0.0.1:{server.port}/hook", PAYLOAD, timeout=2.0)
    took = time.monotonic() - began
    # Given up before the trickle ended: a byte every 0.5 s keeps each read alive until then.
    assert took < TRICKLE_S, f"the 2 s deadline took {took:.1f} s"
    assert server.requests == 1
    err = capsys.readouterr().err
    assert f"notify.webhook http://127.0.0.1:{server.port}/...: not notified (no answer within 2 s)" in err


def test_the_cli_exits_on_time_when_the_webhook_trickles(
    raw_server: Callable[..., RawServer], tmp_path: Path
) -> None:
    # A sweep that fails at once (its directory exists): its webhook is told, within 10 s.
    trickle_s = 90.0
    server = raw_server(_trickle("headers", every_s=1.0, for_s=trickle_s))
    (tmp_path / "debug").mkdir()
    (tmp_path / "debug" / "keep.txt").write_text("a user's file")
    began = time.monotonic()
    done = run_cli(
        "sweep",
        str(DEBUG),
        "--output",
        str(tmp_path),
        "--notify",
        f"http://127.0.0.1:{server.port}/",
        timeout=120,
    )
    took = time.monotonic() - began
    assert done.returncode == 2, done.stderr
    assert server.requests == 1 and "not notified (no answer within 10 s)" in done.stderr
    # Exited before the trickle ended (its 10 s notify deadline, not the server's pace).
    assert took < trickle_s, f"the CLI exited {took:.0f} s after its start"


class _Recorder(BaseHTTPRequestHandler):
    """Every request it gets (method, path, Authorization), answered 200."""

    seen: list[tuple[str, str, Any]] = []

    def _any(self) -> None:
        type(self).seen.append((self.command, self.path, self.headers.get("Authorization")))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = do_PUT = _any  # noqa: N815 (http.server's names)

    def log_message(self, *args: Any) -> None: ...


def _redirecting(code: int, location: str) -> type[BaseHTTPRequestHandler]:
    class Redirect(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(code)
            self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None: ...

    return Redirect


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_a_redirect_is_not_followed_and_not_a_delivery(code: int, capsys: pytest.CaptureFixture[str]) -> None:
    other = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)  # another host:port
    threading.Thread(target=other.serve_forever, daemon=True).start()
    target = f"http://127.0.0.1:{other.server_address[1]}/elsewhere"
    hook = ThreadingHTTPServer(("127.0.0.1", 0), _redirecting(code, target))
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    _Recorder.seen = []
    try:
        delivered = post(
            f"http://hookuser:s3cret@127.0.0.1:{hook.server_address[1]}/hook", PAYLOAD, timeout=5
        )
    finally:
        hook.shutdown()
        other.shutdown()
    assert not delivered
    assert _Recorder.seen == [], "the credentials (and the payload) went to the redirect's host"
    err = capsys.readouterr().err
    to = f"http://127.0.0.1:{other.server_address[1]}/..."
    assert f"not notified (HTTP {code}: a redirect to {to}, not followed" in err
    assert "s3cret" not in err and "elsewhere" not in err


def test_a_huge_answer_is_read_no_further_than_its_cap(raw_server: Callable[..., RawServer]) -> None:
    limit = 256 * 2**20

    def huge(conn: socket.socket, server: RawServer) -> None:
        server.send(conn, f"HTTP/1.1 200 OK\r\nContent-Length: {limit}\r\n\r\n".encode())
        chunk = b"\0" * 2**20
        while server.sent < limit and not server.stop.is_set():
            server.send(conn, chunk)

    server = raw_server(huge)
    assert post(f"http://127.0.0.1:{server.port}/hook", PAYLOAD, timeout=30)  # 200: delivered
    time.sleep(0.5)  # what the server could still push into the closed connection's buffers
    assert server.sent < 32 * 2**20, f"the client read {server.sent / 2**20:.0f} MiB of the answer"
