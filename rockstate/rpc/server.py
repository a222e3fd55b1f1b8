"""The asyncio RPC server: one dict of handlers per role, a task per request.

Each connection starts with the handshake (see ``messages``); after it every
request runs in its own task, so a slow request never holds up the others on
its connection. A handler's ``RockstateError`` reaches the caller as itself,
any other exception as a ``RockstateError`` naming its type (the traceback is
logged here). A bad frame, protocol version or secret closes that connection
only, after an error reply when the socket still takes one.

A connection is an ``asyncio.Protocol`` fed by the loop, not a pair of
streams: a request that is answered without waiting costs no future, task
or turn of the loop (a one-key read took ~40 % less server CPU).

A handler may answer a ``Stream``: its result, then raw bytes on the same
connection, which then closes (a copy's files: no request, frame or encoding
per chunk; read with ``client.streamed``).

Nothing large before the handshake (docs/security.md, ``Limits``): until a
caller is welcomed its frames may hold ``handshake_frame`` bytes (4 KiB) and
its buffer twice that; the whole handshake must end within
``handshake_timeout`` seconds; at most ``max_unauthenticated`` connections
wait in it (a new one beyond that closes the oldest waiting one, so a flood
of half-open connections cannot keep a real caller out for longer than its
own handshake takes) and at most ``max_connections`` are open in all (a new
one beyond that is closed at once). A welcomed caller whose frame stays
incomplete for ``read_timeout`` seconds, or that sends nothing and waits for
nothing for ``idle_timeout`` seconds, is closed. A frame body of more than
``offload_frame`` bytes is decoded on a worker thread (the connection's later
frames wait for it), so one big frame does not hold the loop.
"""

from __future__ import annotations

import asyncio
import logging
import ssl as _ssl
import time
import types
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Generator, Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import (
    AuthenticationError,
    ClusterTimeoutError,
    PermissionDeniedError,
    FrameTruncatedError,
    ProtocolError,
    ProtocolVersionError,
    RockstateError,
    UnknownOperationError,
)

from . import auth
from .frames import HEADER_SIZE, MAGIC, MAX_FRAME, body_size, decode, encode, packer
from .messages import PROTOCOL_VERSION, Challenge, Hello, Message, Welcome, error_reply, parse_request, reply

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Connection:
    """What a handler knows about its caller."""

    peer: str  # the name the caller gave in its Hello
    address: str  # "host:port" of the caller's socket
    roles: frozenset[str] = auth.ROLES  # what the caller's secret grants (every role on a server without secrets)
    node: str | None = None  # the node id its TLS certificate names (a SAN URI rockstate:node:<id>), if any


Handler = Callable[[Any, Connection], Awaitable[Any]]


@dataclass(frozen=True)
class Stream:
    """A handler's answer followed by ``chunks``, raw, on a connection of its own that then closes."""

    result: Any
    chunks: AsyncGenerator[bytes, None]


@dataclass(frozen=True)
class Limits:
    """What a server allows a connection before and after its handshake (see the module docstring)."""

    handshake_frame: int = 4096
    handshake_timeout: float = 5.0
    max_unauthenticated: int = 128
    max_connections: int = 4096
    read_timeout: float = 60.0
    idle_timeout: float | None = None  # None: a welcomed caller's idle connection stays (clients pool them)
    offload_frame: int = 1 << 20


NODE_FIELDS = ("node_id", "node")  # a message's fields that say which node it speaks for
NODE_URI = "rockstate:node:"
"""A certificate binds its holder to a node id with a subjectAltName URI ``rockstate:node:<id>`` (docs/security.md)."""


def _certified_node(transport: asyncio.BaseTransport) -> str | None:
    """The node id the caller's verified TLS certificate names, if it names one."""
    cert = transport.get_extra_info("peercert") if transport.get_extra_info("sslcontext") is not None else None
    for kind, value in (cert or {}).get("subjectAltName", ()):
        if kind == "URI" and value.startswith(NODE_URI):
            return value[len(NODE_URI):]
    return None


def _format_address(sockname: tuple) -> str:
    host, port = sockname[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Server:
    """Serves ``handlers`` (message class -> ``async def handler(msg, conn) -> result``).

    A result is msgpack-native or a ``Message``. Requests for the ``inline``
    operations run as their frame arrives, one at a time per connection in
    the order sent, without a task or a deadline timer of their own: cheaper
    for short operations from blocking clients, which send one request per
    connection at a time. An inline handler runs outside any task until it
    first waits (so it must not use ``asyncio.timeout`` or ``current_task``
    before that); the connection's later frames wait for its answer. An
    inline operation that may wait bounds the wait itself (a write to a
    frozen partition: ``cluster.gate.FREEZE_WAIT``); the caller stops waiting
    at its deadline either way.
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
        limits: Limits = Limits(),
    ) -> None:
        for cls in handlers:
            if not (isinstance(cls, type) and issubclass(cls, Message)):
                raise TypeError(f"handler keys must be Message classes, not {cls!r}")
        self._handlers = {cls.op: handler for cls, handler in handlers.items()}
        self._inline = frozenset(cls.op for cls in inline)
        self.host, self.port, self.name = host, port, name
        self._ssl, self._secret, self._max_frame = ssl, secret, max_frame
        self._pack = packer()  # replies are encoded on the loop's thread only
        self._server: asyncio.Server | None = None
        self._connections: set[_Serving] = set()
        self._unwelcomed: dict[_Serving, None] = {}  # connections still in their handshake, oldest first
        self._requests: set[asyncio.Task] = set()
        self.limits = limits
        self._sweeper: asyncio.TimerHandle | None = None
        self.refused = {"handshake_frame": 0, "handshake_timeout": 0, "unauthenticated_cap": 0, "connection_cap": 0,
                        "read_timeout": 0, "idle_timeout": 0}  # connections closed by the limits, by reason

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Serving(self), self.host, self.port, ssl=self._ssl,
                                                ssl_handshake_timeout=self.limits.handshake_timeout if self._ssl else None)
        self.port = self._server.sockets[0].getsockname()[1]
        self._sweeper = loop.call_later(1.0, self._sweep)

    def _sweep(self) -> None:
        """Once a second: close connections past their handshake, read or idle timeout."""
        now, limits = time.monotonic(), self.limits
        for conn in list(self._unwelcomed):
            if now - conn._since < limits.handshake_timeout:
                break  # oldest first: the rest are younger
            conn._drop("handshake_timeout", f"no handshake within {limits.handshake_timeout:g}s")
        for conn in list(self._connections):
            if conn._conn is None or conn._streaming:
                continue
            if conn._buffer and not conn._reading_paused and now - conn._since > limits.read_timeout:
                conn._drop("read_timeout", f"a frame incomplete for {limits.read_timeout:g}s")
            elif (limits.idle_timeout is not None and not conn._buffer and not conn._busy()
                  and now - conn._since > limits.idle_timeout):
                conn._drop("idle_timeout", f"idle for {limits.idle_timeout:g}s")
        if self._server is not None:
            self._sweeper = asyncio.get_running_loop().call_later(1.0, self._sweep)

    @property
    def address(self) -> str:
        """ "host:port" with the bound port; valid after ``start()``."""
        return _format_address((self.host, self.port))

    async def stop(self) -> None:
        """Stop listening, close every connection and cancel the requests in flight."""
        if self._server is None:
            return
        self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for task in self._requests:
            task.cancel()
        for connection in list(self._connections):
            connection.close()
        await asyncio.gather(*self._requests, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def __aenter__(self) -> Server:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _handle(self, conn: Connection, rid: int, wire: dict, deadline: float | None) -> bytes | Stream:
        """The reply frame to one request (its result or its error); a ``Stream`` with that frame as its result."""
        timer = None if deadline is None else asyncio.timeout(deadline)
        try:
            msg = Message.from_wire(wire)
            if msg.roles is not None and conn.roles.isdisjoint(msg.roles):
                raise PermissionDeniedError(
                    f"{msg.op!r} needs the {' or '.join(sorted(msg.roles))} credential; this connection's grants"
                    f" {', '.join(sorted(conn.roles)) or 'nothing'}", op=msg.op, needs=sorted(msg.roles))
            if conn.node is not None:  # a caller whose certificate names a node speaks for that node only
                for field in NODE_FIELDS:
                    if field in msg._types and getattr(msg, field) != conn.node:
                        raise PermissionDeniedError(
                            f"{msg.op!r} names node {getattr(msg, field)!r} in {field!r}; the caller's certificate is node"
                            f" {conn.node!r}'s (a new node with that certificate registers as {conn.node!r}: give its"
                            " data directory's node.json that id)", op=msg.op, node=conn.node)
            handler = self._handlers.get(msg.op)
            if handler is None:
                raise UnknownOperationError(f"server {self.name!r} has no handler for {msg.op!r}", op=msg.op)
            if timer is None:
                result = await handler(msg, conn)
            else:
                async with timer:
                    result = await handler(msg, conn)
            if isinstance(result, Stream):
                return Stream(encode(reply(rid, result.result), self._max_frame, self._pack), result.chunks)
            return encode(reply(rid, result), self._max_frame, self._pack)
        except Exception as e:
            return self._error_frame(rid, self._as_error(e, wire.get("op"), timer, deadline))

    def _as_error(self, e: Exception, op: Any, timer: asyncio.Timeout | None, deadline: float | None) -> RockstateError:
        if isinstance(e, RockstateError):
            return e
        if isinstance(e, TimeoutError) and timer is not None and timer.expired():
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


class _Serving(asyncio.Protocol):
    """One caller's connection: the greeting, the handshake, then its requests as their frames arrive.

    Reading pauses while an inline request waits (the frames after it wait
    for its answer), while the caller does not take its replies (the
    transport's buffer is full). Once it carries a ``Stream`` it takes no more
    requests.
    """

    def __init__(self, server: Server) -> None:
        self._server = server
        self._buffer = bytearray()
        self._transport: asyncio.Transport = None  # type: ignore[assignment] -- set by connection_made
        self._address = ""
        self._greeted = False
        self._peer = ""  # the name in the caller's Hello
        self._challenge: Challenge | None = None  # sent, its answer not yet read
        self._conn: Connection | None = None  # set once welcomed
        self._waiting: asyncio.Task | None = None  # the inline request that had to wait
        self._writing_paused = self._reading_paused = self._streaming = False
        self._writable: asyncio.Future | None = None  # a stream waits on it while the caller does not read
        self._since = time.monotonic()  # the connection's start; once welcomed, its last complete frame
        self._in_flight = 0  # requests not answered yet

    # -- the loop's calls --------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._address = _format_address(transport.get_extra_info("peername"))
        server, limits = self._server, self._server.limits
        if len(server._connections) >= limits.max_connections:
            server.refused["connection_cap"] += 1
            log.warning("server %r refuses a connection from %s: %d connections open (max_connections)",
                        server.name, self._address, len(server._connections))
            transport.abort()
            return
        server._connections.add(self)
        server._unwelcomed[self] = None
        if len(server._unwelcomed) > limits.max_unauthenticated:
            oldest = next(iter(server._unwelcomed))
            oldest._drop("unauthenticated_cap", f"more than {limits.max_unauthenticated} connections in their handshake")

    def connection_lost(self, exc: Exception | None) -> None:
        self._server._connections.discard(self)
        self._server._unwelcomed.pop(self, None)
        self._wake_writer()

    def _drop(self, reason: str, why: str) -> None:
        """Close the connection now, for one of the server's limits (no reply: the caller may not be a rockstate one)."""
        server = self._server
        server.refused[reason] += 1
        server._unwelcomed.pop(self, None)
        server._connections.discard(self)
        log.info("server %r closes the connection from %s: %s", server.name, self._address, why)
        self._transport.abort()

    def _busy(self) -> bool:
        return self._in_flight > 0 or self._waiting is not None

    def data_received(self, data: bytes) -> None:
        if self._streaming:  # nothing more is read from a stream's connection (still read: its end closes it)
            return
        self._buffer += data
        self._take()
        if (self._conn is None and len(self._buffer) > 2 * self._server.limits.handshake_frame + len(MAGIC)
                and not self._transport.is_closing()):  # frames within the limit, but more than a handshake's
            self._server.refused["handshake_frame"] += 1
            self._refuse(ProtocolError(f"{len(self._buffer)} bytes sent before the handshake ended (at most "
                                       f"{self._server.limits.handshake_frame} a frame)", size=len(self._buffer)))
            self._buffer.clear()

    def eof_received(self) -> None:
        if self._buffer:  # the caller stopped in the middle of the greeting or of a frame
            self._refuse(self._truncated() if self._greeted else self._bad_greeting(bytes(self._buffer)))
        # returning None: the transport closes

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._pause_reading_if_needed()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._pause_reading_if_needed()
        self._wake_writer()

    def _wake_writer(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def close(self) -> None:
        self._transport.close()

    # -- frames ------------------------------------------------------------

    def _take(self) -> None:
        """Handle what the buffer holds, while nothing waits."""
        try:
            while self._waiting is None and not self._transport.is_closing():
                if not self._greeted:
                    if len(self._buffer) < len(MAGIC):
                        return
                    self._greet()
                    continue
                frame = self._frame()
                if frame is None:
                    return
                rid, wire, deadline = parse_request(frame)
                if self._conn is None:
                    self._handshake(rid, wire)
                else:
                    self._request(rid, wire, deadline)
        except (ProtocolError, AuthenticationError) as e:
            self._refuse(e)

    def _frame(self) -> Any | None:
        """The next whole frame's body, decoded; None until it has arrived (or while a big one is decoded off the loop)."""
        buffer = self._buffer
        if len(buffer) < HEADER_SIZE:
            return None
        welcomed = self._conn is not None
        size = body_size(bytes(buffer[:HEADER_SIZE]), self._server._max_frame)
        if not welcomed and size > self._server.limits.handshake_frame:
            self._server.refused["handshake_frame"] += 1
            raise ProtocolError(f"frame of {size} bytes before the handshake ended exceeds the handshake's limit of "
                                f"{self._server.limits.handshake_frame} bytes", size=size, limit=self._server.limits.handshake_frame)
        end = HEADER_SIZE + size
        if len(buffer) < end:
            return None
        body = buffer[HEADER_SIZE:end]
        del buffer[:end]
        if welcomed:
            self._since = time.monotonic()
        if end - HEADER_SIZE > self._server.limits.offload_frame:
            task = self._waiting = asyncio.get_running_loop().create_task(asyncio.to_thread(decode, bytes(body)))
            del body
            self._server._requests.add(task)  # a stopping server cancels and awaits it like a request
            task.add_done_callback(self._decoded)
            self._pause_reading_if_needed()
            return None
        return decode(body)

    def _decoded(self, task: asyncio.Task) -> None:
        """A big frame decoded on a worker thread: handle it, then what arrived meanwhile."""
        self._server._requests.discard(task)
        self._waiting = None
        if task.cancelled() or self._transport.is_closing():
            return
        try:
            rid, wire, deadline = parse_request(task.result())
            self._request(rid, wire, deadline)
        except (ProtocolError, AuthenticationError) as e:
            self._refuse(e)
            return
        self._pause_reading_if_needed()
        self._take()

    def _truncated(self) -> FrameTruncatedError:
        got = len(self._buffer)
        if got < HEADER_SIZE:
            return FrameTruncatedError(f"truncated frame: connection closed after {got} header bytes")
        size = body_size(bytes(self._buffer[:HEADER_SIZE]), self._server._max_frame)
        return FrameTruncatedError(f"truncated frame: connection closed after {got - HEADER_SIZE} of {size} bytes")

    def _refuse(self, error: RockstateError) -> None:
        """Answer a bad frame, version or secret with an error about the whole connection, and close it."""
        log.warning("server %r closes the connection from %s: %s", self._server.name, self._address, error)
        self._write(encode(error_reply(None, error)))
        self._transport.close()  # it still sends what was written

    def _write(self, frame: bytes) -> None:
        # a caller that went away has nobody to tell; on a stream's connection, only the stream is written
        if not self._transport.is_closing() and not self._streaming:
            self._transport.write(frame)

    # -- the handshake -----------------------------------------------------

    def _greet(self) -> None:
        got = bytes(self._buffer[:len(MAGIC)])
        if got != MAGIC:  # an older client, or not rockstate: the error reply is a plain frame any version reads
            raise self._bad_greeting(got)
        del self._buffer[:len(MAGIC)]
        self._greeted = True
        self._transport.write(MAGIC)

    def _bad_greeting(self, got: bytes) -> ProtocolVersionError:
        return ProtocolVersionError(
            f"server {self._server.name!r} speaks rockstate protocol version {PROTOCOL_VERSION}, which opens with a greeting;"
            f" the client sent {got!r} (an older rockstate client, or not a rockstate client)",
            server_version=PROTOCOL_VERSION)

    def _handshake(self, rid: int, wire: dict) -> None:
        server = self._server
        roles, proof = auth.ROLES, None
        if self._challenge is not None:
            roles, proof = auth.check(server._secret, self._challenge, wire)  # type: ignore[arg-type]
        else:
            if wire.get("op") != Hello.op:
                raise ProtocolError(f"expected {Hello.op!r} first, got {wire.get('op')!r}")
            version = wire.get("version")
            if version != PROTOCOL_VERSION:
                raise ProtocolVersionError(
                    f"client speaks protocol version {version!r}, server {server.name!r} speaks version"
                    f" {PROTOCOL_VERSION}", client_version=version, server_version=PROTOCOL_VERSION)
            hello = Hello.from_wire(wire)
            self._peer = hello.name
            if server._secret is not None:
                self._challenge = auth.new_challenge()
                self._write(encode(reply(rid, self._challenge)))
                return
        self._conn = Connection(peer=self._peer, address=self._address, roles=roles, node=_certified_node(self._transport))
        server._unwelcomed.pop(self, None)
        self._since = time.monotonic()
        self._write(encode(reply(rid, Welcome(name=server.name, proof=proof))))

    # -- requests ----------------------------------------------------------

    def _request(self, rid: int, wire: dict, deadline: float | None) -> None:
        server = self._server
        if wire.get("op") in server._inline:
            handling = server._handle(self._conn, rid, wire, None)  # type: ignore[arg-type]
            try:
                waits_on = handling.send(None)
            except StopIteration as done:  # answered without waiting: the common case
                self._write(done.value)
                return
            # (the loop is asked for only here: asyncio.get_running_loop() costs a getpid() system call)
            task = self._waiting = asyncio.get_running_loop().create_task(_carried_on(handling, waits_on))
            task.add_done_callback(self._inline_answered)
            self._pause_reading_if_needed()
        else:
            task = asyncio.get_running_loop().create_task(server._handle(self._conn, rid, wire, deadline))  # type: ignore[arg-type]
            task.add_done_callback(self._answered)
        self._in_flight += 1
        server._requests.add(task)

    def _answered(self, task: asyncio.Task) -> None:
        self._server._requests.discard(task)
        self._in_flight -= 1
        self._since = time.monotonic()
        if task.cancelled():
            return
        answer = task.result()
        if isinstance(answer, Stream):
            self._streaming = True  # the connection is the stream's now: no more requests are read from it
            self._buffer.clear()
            stream = asyncio.get_running_loop().create_task(self._send(answer))
            self._server._requests.add(stream)
            stream.add_done_callback(self._server._requests.discard)
        else:
            self._write(answer)

    async def _send(self, stream: Stream) -> None:
        """The stream's answer frame, then its chunks as the caller takes them; then the connection closes."""
        transport = self._transport
        try:
            if not transport.is_closing():
                transport.write(stream.result)
            async for chunk in stream.chunks:
                if transport.is_closing():  # the caller went away
                    return
                transport.write(chunk)
                if self._writing_paused:
                    self._writable = asyncio.get_running_loop().create_future()
                    await self._writable
        except Exception:  # noqa: BLE001 -- the caller sees the stream end early and says so
            log.exception("server %r: a stream to %s failed", self._server.name, self._address)
        finally:
            await stream.chunks.aclose()  # the generator's open file is closed
            transport.close()

    def _inline_answered(self, task: asyncio.Task) -> None:
        self._answered(task)
        self._waiting = None
        self._pause_reading_if_needed()
        self._take()

    def _pause_reading_if_needed(self) -> None:
        pause = self._waiting is not None or self._writing_paused
        if pause != self._reading_paused and not self._transport.is_closing():
            self._reading_paused = pause
            (self._transport.pause_reading if pause else self._transport.resume_reading)()


async def _carried_on(coro: Coroutine, waits_on: Any) -> Any:
    """The result of ``coro``, which ``send(None)`` started and which now waits on ``waits_on``."""
    return await _continued(coro, waits_on)


@types.coroutine
def _continued(coro: Coroutine, waits_on: Any) -> Generator[Any, Any, Any]:
    """Passes what the task sends (a wake-up, a cancellation) on to ``coro`` until it returns."""
    while True:
        try:
            try:
                sent = yield waits_on
            except BaseException as e:  # a cancellation reaches the coroutine where it waits
                waits_on = coro.throw(e)
            else:
                waits_on = coro.send(sent)
        except StopIteration as done:
            return done.value
