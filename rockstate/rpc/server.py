"""The asyncio RPC server: one dict of handlers per role, a task per request.

Each connection starts with the handshake (see ``messages``); after it every
request runs in its own task, so a slow request never holds up the others on
its connection. A handler's ``RockstateError`` reaches the caller as itself,
any other exception as a ``RockstateError`` naming its type (the traceback is
logged here). A bad frame, protocol version or secret closes that connection
only, after an error reply when the socket still takes one.
"""

from __future__ import annotations

import asyncio
import logging
import ssl as _ssl
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from rockstate.errors import (
    AuthenticationError,
    ClusterTimeoutError,
    ProtocolError,
    ProtocolVersionError,
    RockstateError,
    UnknownOperationError,
)

from . import auth
from .frames import MAGIC, MAX_FRAME, encode, read_frame, write_frame
from .messages import PROTOCOL_VERSION, Hello, Message, Welcome, error_reply, parse_request, reply

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Connection:
    """What a handler knows about its caller."""

    peer: str  # the name the caller gave in its Hello
    address: str  # "host:port" of the caller's socket


Handler = Callable[[Any, Connection], Awaitable[Any]]


def _format_address(sockname: tuple) -> str:
    host, port = sockname[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Server:
    """Serves ``handlers`` (message class -> ``async def handler(msg, conn) -> result``).

    A result is msgpack-native or a ``Message``. Requests for the ``inline``
    operations are handled in the connection's own loop, without a task or a
    deadline timer of their own: cheaper for short operations from blocking
    clients, which send one request per connection at a time. An inline
    operation that may wait bounds the wait itself (a write to a frozen
    partition: ``cluster.gate.FREEZE_WAIT``); the caller stops waiting at its
    deadline either way.
    """

    def __init__(
        self,
        handlers: dict[type[Message], Handler],
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        name: str,
        ssl: _ssl.SSLContext | None = None,
        secret: auth.Secret | None = None,
        max_frame: int = MAX_FRAME,
        inline: Iterable[type[Message]] = (),
    ) -> None:
        for cls in handlers:
            if not (isinstance(cls, type) and issubclass(cls, Message)):
                raise TypeError(f"handler keys must be Message classes, not {cls!r}")
        self._handlers = {cls.op: handler for cls, handler in handlers.items()}
        self._inline = frozenset(cls.op for cls in inline)
        self.host, self.port, self.name = host, port, name
        self._ssl, self._secret, self._max_frame = ssl, secret, max_frame
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task, asyncio.StreamWriter] = {}  # serving task -> its socket
        self._requests: set[asyncio.Task] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port, ssl=self._ssl)
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def address(self) -> str:
        """ "host:port" with the bound port; valid after ``start()``."""
        return _format_address((self.host, self.port))

    async def stop(self) -> None:
        """Stop listening, close every connection and cancel the requests in flight."""
        if self._server is None:
            return
        self._server.close()
        for task in self._requests:
            task.cancel()
        for writer in self._connections.values():
            writer.close()  # ends its serving task; cancelling that would make asyncio log an error
        await asyncio.gather(*self._requests, *self._connections, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def __aenter__(self) -> Server:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._connections[task] = writer  # type: ignore[index]
        address = _format_address(writer.get_extra_info("peername"))
        try:
            conn = await self._handshake(reader, writer, address)
            while True:
                rid, wire, deadline = parse_request(await read_frame(reader, self._max_frame))
                if wire.get("op") in self._inline:
                    await self._handle(writer, conn, rid, wire, None)
                    continue
                request = asyncio.create_task(self._handle(writer, conn, rid, wire, deadline))
                self._requests.add(request)
                request.add_done_callback(self._requests.discard)
        except (ProtocolError, AuthenticationError) as e:
            log.warning("server %r closes the connection from %s: %s", self.name, address, e)
            writer.write(encode(error_reply(None, e)))  # close() still flushes it
        except OSError:
            pass  # the peer went away (ConnectionLostError included)
        finally:
            del self._connections[task]  # type: ignore[arg-type]
            writer.close()

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         address: str) -> Connection:
        try:
            greeting = await reader.readexactly(len(MAGIC))
        except asyncio.IncompleteReadError as e:
            greeting = e.partial
        if greeting != MAGIC:  # an older client, or not rockstate: the error reply is a plain frame any version reads
            raise ProtocolVersionError(
                f"server {self.name!r} speaks rockstate protocol version {PROTOCOL_VERSION}, which opens with a greeting;"
                f" the client sent {greeting!r} (an older rockstate client, or not a rockstate client)",
                server_version=PROTOCOL_VERSION)
        writer.write(MAGIC)
        rid, wire, _ = parse_request(await read_frame(reader, self._max_frame))
        if wire.get("op") != Hello.op:
            raise ProtocolError(f"expected {Hello.op!r} first, got {wire.get('op')!r}")
        version = wire.get("version")
        if version != PROTOCOL_VERSION:
            raise ProtocolVersionError(
                f"client speaks protocol version {version!r}, server {self.name!r} speaks version"
                f" {PROTOCOL_VERSION}", client_version=version, server_version=PROTOCOL_VERSION)
        hello = Hello.from_wire(wire)
        if self._secret is not None:
            challenge = auth.new_challenge()
            await write_frame(writer, reply(rid, challenge))
            rid, wire, _ = parse_request(await read_frame(reader, self._max_frame))
            auth.check(self._secret, challenge, wire)
        await write_frame(writer, reply(rid, Welcome(name=self.name)))
        return Connection(peer=hello.name, address=address)

    async def _handle(self, writer: asyncio.StreamWriter, conn: Connection, rid: int, wire: dict,
                      deadline: float | None) -> None:
        timer = asyncio.timeout(deadline)
        try:
            msg = Message.from_wire(wire)
            handler = self._handlers.get(msg.op)
            if handler is None:
                raise UnknownOperationError(f"server {self.name!r} has no handler for {msg.op!r}", op=msg.op)
            async with timer:  # no deadline: no timer is armed
                result = await handler(msg, conn)
            frame = encode(reply(rid, result), self._max_frame)
        except Exception as e:
            frame = self._error_frame(rid, self._as_error(e, wire.get("op"), timer, deadline))
        try:
            writer.write(frame)
            await writer.drain()
        except OSError:
            pass  # the caller is gone; nobody to tell

    def _as_error(self, e: Exception, op: Any, timer: asyncio.Timeout, deadline: float | None) -> RockstateError:
        if isinstance(e, RockstateError):
            return e
        if isinstance(e, TimeoutError) and timer.expired():
            return ClusterTimeoutError(f"{op!r} passed its deadline of {deadline:g}s on server {self.name!r}",
                                       op=op, deadline=deadline)
        log.error("server %r: handler for %r failed", self.name, op, exc_info=e)
        return RockstateError(f"{op!r} failed on server {self.name!r}: {type(e).__name__}: {e}",
                              op=op, type=type(e).__name__)

    def _error_frame(self, rid: int, error: RockstateError) -> bytes:
        try:
            return encode(error_reply(rid, error), self._max_frame)
        except ProtocolError:  # the error's data is not msgpack-native: send it without
            return encode({"id": rid, "err": {"code": error.code, "message": error.message, "data": {}}})
