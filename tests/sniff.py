"""What crosses a network, as someone on it sees it: the TCP payloads of interfaces of this
host (root; Linux AF_PACKET), kept per connection, in the order captured.

    with Capture(["tnv1234c0x0", "tnv1234c0x1"]) as cap:
        ...                               # traffic between the namespaced nodes
    for flow, data in cap.flows().items(): ...

Each interface is read on its own (a frame that crosses two is not counted twice); a
connection's bytes are its segments' payloads in order of arrival, which on a veth is the
order sent.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import Optional

ETH_P_ALL = 0x0003


@dataclass(frozen=True)
class Flow:
    """One direction of one TCP connection, as captured on `interface`."""

    interface: str
    src: str
    sport: int
    dst: str
    dport: int


def _tcp_payload(frame: bytes) -> Optional[tuple[str, int, str, int, bytes]]:
    """(src, sport, dst, dport, payload) of an Ethernet frame carrying IPv4 TCP, else None."""
    if len(frame) < 14 + 20 or frame[12:14] != b"\x08\x00":
        return None
    ip = frame[14:]
    ihl = (ip[0] & 0x0F) * 4
    total = struct.unpack("!H", ip[2:4])[0]
    if ip[9] != 6:  # TCP
        return None
    src, dst = socket.inet_ntoa(ip[12:16]), socket.inet_ntoa(ip[16:20])
    tcp = ip[ihl:total]
    if len(tcp) < 20:
        return None
    sport, dport = struct.unpack("!HH", tcp[:4])
    offset = (tcp[12] >> 4) * 4
    return src, sport, dst, dport, bytes(tcp[offset:])


class Capture:
    """Capture TCP payloads on `interfaces` from `__enter__` to `__exit__`."""

    def __init__(self, interfaces: list[str]):
        self.interfaces = interfaces
        self._data: dict[Flow, bytearray] = defaultdict(bytearray)
        self._stop = threading.Event()
        self._socks: list[socket.socket] = []
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> Capture:
        for name in self.interfaces:
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
            s.bind((name, 0))
            self._socks.append(s)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        names = {s.fileno(): n for s, n in zip(self._socks, self.interfaces, strict=True)}
        while not self._stop.is_set():
            ready, _, _ = select.select(self._socks, [], [], 0.2)
            for s in ready:
                frame = s.recv(65535)
                parsed = _tcp_payload(frame)
                if parsed and parsed[4]:
                    src, sport, dst, dport, payload = parsed
                    self._data[Flow(names[s.fileno()], src, sport, dst, dport)] += payload

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for s in self._socks:
            s.close()

    def flows(self) -> dict[Flow, bytes]:
        """Every connection direction that carried data, and its bytes."""
        return {f: bytes(d) for f, d in self._data.items()}


def is_tls(data: bytes) -> bool:
    """Whether a connection's bytes begin as TLS does: a handshake or alert record (content
    type 22 or 21, version 3.x). A plain HTTP/2 (gRPC) connection begins with its preface."""
    return len(data) >= 3 and data[0] in (0x15, 0x16, 0x17) and data[1] == 3
