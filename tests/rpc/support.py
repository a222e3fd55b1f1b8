"""Test-only messages and handlers, and an event loop in a thread for servers that blocking clients call."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from rockstate.errors import from_wire
from rockstate.rpc.frames import MAGIC, read_frame_sync, write_frame_sync
from rockstate.rpc.messages import PROTOCOL_VERSION, Message, parse_reply
from rockstate.rpc.server import Connection


class Echo(Message):
    op = "test.echo"
    value: Any


class Fail(Message):
    """Raise the rockstate error with this wire code."""

    op = "test.fail"
    code: str


class Crash(Message):
    op = "test.crash"


class Sleep(Message):
    op = "test.sleep"
    seconds: float


class Block(Message):
    """Block the server's event loop: the server cannot answer in time."""

    op = "test.block"
    seconds: float


class Big(Message):
    """A small request with a large reply."""

    op = "test.big"
    size: int


class Whoami(Message):
    op = "test.whoami"


class Wrap(Message):
    op = "test.wrap"
    value: Any


class Wrapped(Message):
    op = "test.wrapped"
    value: Any
    note: str = ""


class Unserved(Message):
    """No server in these tests handles it."""

    op = "test.unserved"


async def echo(msg: Echo, conn: Connection) -> Any:
    return msg.value


async def fail(msg: Fail, conn: Connection) -> None:
    raise from_wire({"code": msg.code, "message": f"failed with {msg.code}", "data": {"code": msg.code, "n": 7}})


async def crash(msg: Crash, conn: Connection) -> None:
    raise ValueError("boom")


async def sleep(msg: Sleep, conn: Connection) -> str:
    await asyncio.sleep(msg.seconds)
    return "slept"


async def block(msg: Block, conn: Connection) -> str:
    time.sleep(msg.seconds)
    return "blocked"


async def big(msg: Big, conn: Connection) -> bytes:
    return b"x" * msg.size


async def whoami(msg: Whoami, conn: Connection) -> dict:
    return {"peer": conn.peer, "address": conn.address}


async def wrap(msg: Wrap, conn: Connection) -> Wrapped:
    return Wrapped(value=msg.value, note="wrapped")


HANDLERS = {Echo: echo, Fail: fail, Crash: crash, Sleep: sleep, Block: block, Big: big, Whoami: whoami,
            Wrap: wrap}


def wait_for(condition: Callable[[], bool], timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.001)


class LoopThread:
    """An asyncio loop running in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Any, timeout: float = 10) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()


class RawConnection:
    """A bare socket speaking frames by hand, to send what a Channel never would."""

    def __init__(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=5)
        self.stream = self.sock.makefile("rb")
        self.sock.sendall(MAGIC)
        assert self.stream.read(len(MAGIC)) == MAGIC

    def hello(self, version: int = PROTOCOL_VERSION) -> tuple[int | None, Any]:
        self.send({"id": 0, "msg": {"op": "hello", "version": version, "name": "raw"}, "deadline": None})
        return self.reply()

    def send(self, obj: Any) -> None:
        write_frame_sync(self.sock, obj)

    def reply(self) -> tuple[int | None, Any]:
        return parse_reply(read_frame_sync(self.stream))

    def closed_by_peer(self) -> bool:
        """Whether the server has closed the connection, once all it sent is read."""
        return self.stream.read(1) == b""

    def close(self) -> None:
        self.stream.close()
        self.sock.close()
