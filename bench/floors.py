"""What bounds any Python server on this machine, measured beside the goals: servers that do nothing else.

``round_trip_p50_us(hops, ...)``: the p50 of a one-key-sized round trip (a
70-byte request, a ``reply_bytes`` reply) from a blocking socket with
TCP_NODELAY, as rockstate's client sends it, to a uvloop echo server
(``hops=1``), or through ``hops - 1`` uvloop relays in front of it, each
forwarding the request to the next server and answering once that answered:
the shape of a write to a primary that waits for its backup, with no work at
either end.

``socket_copy_mb_s(files, target)``: files sent over one loopback TCP
connection with ``socket.sendfile`` to another process that writes them: a
plain copy between two processes, the shape of a backup's catch-up copy.
"""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import struct
import subprocess
import sys
import time

SERVER = r"""
import asyncio, sys, uvloop
REPLY = b"v" * int(sys.argv[1])
class Echo(asyncio.Protocol):
    def connection_made(self, transport): self.transport = transport
    def data_received(self, data): self.transport.write(REPLY)
class Next(asyncio.Protocol):  # the relay's connection to the next server; one request at a time
    def connection_made(self, transport): self.transport, self.waiting = transport, None
    def data_received(self, data): self.waiting.write(REPLY)
class Relay(asyncio.Protocol):
    def __init__(self, next_): self.next = next_
    def connection_made(self, transport): self.transport = transport
    def data_received(self, data):
        self.next.waiting = self.transport
        self.next.transport.write(data)
async def main():
    loop = asyncio.get_running_loop()
    if len(sys.argv) > 2:
        _, next_ = await loop.create_connection(Next, "127.0.0.1", int(sys.argv[2]))
        next_.transport.get_extra_info("socket").setsockopt(6, 1, 1)  # TCP_NODELAY, as the nodes' channels
        server = await loop.create_server(lambda: Relay(next_), "127.0.0.1", 0)
    else:
        server = await loop.create_server(Echo, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.sleep(3600)
uvloop.run(main())
"""


@contextlib.contextmanager
def _listening(code: str, *args: object):
    """Run ``code`` in a process of its own, which prints the port it listens on; yields that port."""
    proc = subprocess.Popen([sys.executable, "-c", code, *map(str, args)], stdout=subprocess.PIPE, text=True)
    try:
        yield int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def _servers(hops: int, reply_bytes: int):
    """An echo server behind ``hops - 1`` relays; yields the first one's port."""
    with contextlib.ExitStack() as stack:
        port = stack.enter_context(_listening(SERVER, reply_bytes))
        for _ in range(hops - 1):
            port = stack.enter_context(_listening(SERVER, reply_bytes, port))
        yield port


def round_trip_p50_us(hops: int, calls: int, warmup: int, reply_bytes: int = 130) -> float:
    with _servers(hops, reply_bytes) as port, socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        samples, request = [], b"r" * 70
        for i in range(calls + warmup):
            start = time.perf_counter_ns()
            sock.sendall(request)
            got = 0
            while got < reply_bytes:
                got += len(sock.recv(4096))
            if i >= warmup:
                samples.append(time.perf_counter_ns() - start)
    return statistics.median(samples) / 1000


RECEIVER = r"""
import os, socket, struct, sys
server = socket.create_server(("127.0.0.1", 0))
print(server.getsockname()[1], flush=True)
conn, _ = server.accept()
view = memoryview(bytearray(4 << 20))
def exactly(n):
    got = bytearray()
    while len(got) < n:
        chunk = conn.recv(n - len(got))
        if not chunk:
            raise SystemExit("sender went away")
        got += chunk
    return bytes(got)
while True:
    length, size = struct.unpack(">HQ", exactly(10))
    if not length:
        break
    with open(os.path.join(sys.argv[1], exactly(length).decode()), "wb") as f:
        while size:
            n = conn.recv_into(view, min(size, len(view)))
            if not n:
                raise SystemExit("sender went away")
            f.write(view[:n])
            size -= n
conn.sendall(b"k")
"""


def socket_copy_mb_s(files: list[str], target: str) -> float:
    """MB/s of sending ``files`` over one loopback TCP connection (``socket.sendfile``) to another process that
    writes them into ``target``: a plain copy between two processes, with no protocol of rockstate's."""
    size = sum(os.path.getsize(path) for path in files)
    with _listening(RECEIVER, target) as port, socket.create_connection(("127.0.0.1", port)) as sock:
        start = time.perf_counter()
        for i, path in enumerate(files):
            name = f"{i:06d}-{os.path.basename(path)}".encode()
            sock.sendall(struct.pack(">HQ", len(name), os.path.getsize(path)) + name)
            with open(path, "rb") as f:
                sock.sendfile(f)
        sock.sendall(struct.pack(">HQ", 0, 0))
        if sock.recv(1) != b"k":
            raise RuntimeError("the receiver did not take every file")
        return size / (time.perf_counter() - start) / 1e6
