"""Attacks on an RPC port before the handshake, for tests/security and bench/attack.py (real sockets, real processes).

``frame_bomb``: greet, then announce a frame of ``size`` bytes and send it.
``half_open``: ``n`` connections that greet (or not) and then say nothing.
``slowloris``: connections that dribble a Hello frame a byte at a time.
``rss(pid)``: a process's resident set, in bytes (``VmRSS``), ``peak_rss``: its high-water mark (``VmHWM``).
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import msgpack

from ..rpc.frames import MAGIC


def _host_port(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host.strip("[]"), int(port)


def rss(pid: int, field: str = "VmRSS") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise LookupError(field)


def peak_rss(pid: int) -> int:
    return rss(pid, "VmHWM")


def frame_bomb(address: str, size: int = 32 << 20, chunk: int = 1 << 20) -> tuple[int, bytes]:
    """Send a ``size``-byte frame of empty maps before any handshake; answers (bytes the server took, what it replied)."""
    sent = 0
    with socket.create_connection(_host_port(address), timeout=10) as sock:
        sock.sendall(MAGIC + struct.pack(">I", size))
        body = b"\x80" * chunk  # msgpack empty maps: the most objects per byte
        try:
            while sent < size:
                sent += sock.send(body[: min(chunk, size - sent)])
        except OSError:
            pass
        got = b""
        try:
            while data := sock.recv(65536):
                got += data
        except OSError:
            pass
    return sent, got


class Flood:
    """``n`` half-open connections (``greet``: after the greeting), kept open until ``close``; ``slowloris``: more
    that send a Hello frame one byte every ``interval`` seconds, reconnecting when closed."""

    def __init__(self, address: str, n: int = 1000, greet: bool = True, slowloris: int = 0, interval: float = 0.2) -> None:
        self.address, self.n, self.greet, self.slow, self.interval = address, n, greet, slowloris, interval
        self.socks: list[socket.socket] = []
        self.opened = self.failed = self.reconnects = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> "Flood":
        for _ in range(self.n):
            try:
                s = socket.create_connection(_host_port(self.address), timeout=5)
                if self.greet:
                    s.sendall(MAGIC)
                self.socks.append(s)
                self.opened += 1
            except OSError:
                self.failed += 1
        for _ in range(self.slow):
            t = threading.Thread(target=self._dribble, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def _dribble(self) -> None:
        hello = msgpack.packb({"id": 0, "msg": {"op": "hello", "version": 2, "name": "x" * 200}, "deadline": None})
        data = MAGIC + struct.pack(">I", len(hello)) + hello
        while not self._stop.is_set():
            try:
                with socket.create_connection(_host_port(self.address), timeout=5) as s:
                    for i in range(len(data)):
                        if self._stop.wait(self.interval):
                            return
                        s.sendall(data[i:i + 1])
            except OSError:
                self.reconnects += 1

    def still_open(self) -> int:
        """How many of the half-open connections the server has not closed."""
        alive = 0
        for s in self.socks:
            s.setblocking(False)
            try:
                while s.recv(65536):  # the server's greeting, an error reply: read on to the end or to "nothing yet"
                    pass
            except BlockingIOError:
                alive += 1  # open, silent
            except OSError:
                pass  # reset: closed
        return alive

    def close(self) -> None:
        self._stop.set()
        for s in self.socks:
            s.close()
        for t in self._threads:
            t.join(timeout=5)

    def __exit__(self, *exc: object) -> None:
        self.close()


def latencies(call, seconds: float) -> list[float]:
    """Seconds each ``call()`` took, back to back for ``seconds``."""
    out = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        call()
        out.append(time.perf_counter() - start)
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
