"""One caller's connection to a ``Server``: the greeting, the handshake, then its requests as their frames arrive.

A connection is an ``asyncio.Protocol`` fed by the loop, not a pair of
streams: a request that is answered without waiting costs no future, task
or turn of the loop (a one-key read took ~40 % less server CPU).

It enforces the server's ``Limits`` (``connection``'s docstring, docs/security.md)
and knows its server only through a ``ServerSide``: public names for the
dispatch, the limits and the counts of refusals, the registry of
connections and the requests in flight, never the ``Server`` itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
import types
from collections.abc import Callable, Coroutine, Generator, Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import AuthenticationError, FrameTruncatedError, ProtocolError, ProtocolVersionError, RockstateError

from . import auth
from .connection import Connection, Limits, Stream, certified_node, format_address
from .frames import HEADER_SIZE, MAGIC, body_size, decode, encode
from .messages import PROTOCOL_VERSION, Challenge, Hello, Welcome, error_reply, parse_request, reply

log = logging.getLogger("rockstate.rpc.server")  # the server's log, as before the connection had a module of its own


class Connections:
    """A server's open connections, and those of them still in their handshake (oldest first)."""

    def __init__(self) -> None:
        self._open: set[Serving] = set()
        self._unwelcomed: dict[Serving, None] = {}
        self.closed = False  # the server stopped: a connection the loop still hands over is refused

    def __len__(self) -> int:
        return len(self._open)

    def __iter__(self) -> Iterator[Serving]:
        return iter(list(self._open))  # a copy: closing one removes it

    def add(self, conn: Serving) -> None:
        self._open.add(conn)
        self._unwelcomed[conn] = None

    def close(self) -> None:
        self.closed = True
        for conn in list(self._open):
            conn.close()

    def welcomed(self, conn: Serving) -> None:
        self._unwelcomed.pop(conn, None)

    def remove(self, conn: Serving) -> None:
        self._unwelcomed.pop(conn, None)
        self._open.discard(conn)

    @property
    def in_handshake(self) -> int:
        return len(self._unwelcomed)

    def oldest_in_handshake(self) -> Serving:
        return next(iter(self._unwelcomed))

    def sweep(self, limits: Limits) -> None:
        """Close the connections past their handshake, read or idle timeout."""
        now = time.monotonic()
        for conn in list(self._unwelcomed):
            if now - conn.since < limits.handshake_timeout:
                break  # oldest first: the rest are younger
            conn.drop("handshake_timeout", f"no handshake within {limits.handshake_timeout:g}s")
        for conn in list(self._open):
            conn.expire(now, limits)


@dataclass(frozen=True, eq=False)
class ServerSide:
    """What a server's connections use of it; the ``Server`` holds the same objects."""

    name: str
    handle: Callable[[Connection, int, dict, float | None], Coroutine[Any, Any, bytes | Stream]]  # a request's reply
    inline: frozenset[str]  # the operations answered as their frame arrives (``Server``)
    secret: auth.Secret | auth.Credentials | None
    max_frame: int
    limits: Limits
    refused: dict[str, int]  # connections closed by the limits, by reason
    connections: Connections
    requests: set[asyncio.Task]  # in flight: a stopping server cancels and awaits them


class Serving(asyncio.Protocol):
    """One caller's connection: the greeting, the handshake, then its requests as their frames arrive.

    Reading pauses while an inline request waits (the frames after it wait
    for its answer), while the caller does not take its replies (the
    transport's buffer is full). Once it carries a ``Stream`` it takes no more
    requests.
    """

    def __init__(self, side: ServerSide) -> None:
        self._side = side
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
        self.since = time.monotonic()  # the connection's start; once welcomed, its last complete frame
        self._in_flight = 0  # requests not answered yet

    # -- the loop's calls --------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._address = format_address(transport.get_extra_info("peername"))
        side, limits = self._side, self._side.limits
        connections = side.connections
        if connections.closed:  # accepted just before the server stopped listening
            transport.abort()
            return
        if len(connections) >= limits.max_connections:
            side.refused["connection_cap"] += 1
            log.warning("server %r refuses a connection from %s: %d connections open (max_connections)",
                        side.name, self._address, len(connections))
            transport.abort()
            return
        connections.add(self)
        if connections.in_handshake > limits.max_unauthenticated:
            connections.oldest_in_handshake().drop(
                "unauthenticated_cap", f"more than {limits.max_unauthenticated} connections in their handshake")

    def connection_lost(self, exc: Exception | None) -> None:
        self._side.connections.remove(self)
        self._wake_writer()

    def drop(self, reason: str, why: str) -> None:
        """Close the connection now, for one of the server's limits (no reply: the caller may not be a rockstate one)."""
        side = self._side
        side.refused[reason] += 1
        side.connections.remove(self)
        log.info("server %r closes the connection from %s: %s", side.name, self._address, why)
        self._transport.abort()

    def expire(self, now: float, limits: Limits) -> None:
        """Close a welcomed connection past its read or idle timeout (the server's sweep, once a second)."""
        if self._conn is None or self._streaming:
            return
        if self._buffer and not self._reading_paused and now - self.since > limits.read_timeout:
            self.drop("read_timeout", f"a frame incomplete for {limits.read_timeout:g}s")
        elif (limits.idle_timeout is not None and not self._buffer and not self._busy()
              and now - self.since > limits.idle_timeout):
            self.drop("idle_timeout", f"idle for {limits.idle_timeout:g}s")

    def _busy(self) -> bool:
        return self._in_flight > 0 or self._waiting is not None

    def data_received(self, data: bytes) -> None:
        if self._streaming:  # nothing more is read from a stream's connection (still read: its end closes it)
            return
        self._buffer += data
        self._take()
        if (self._conn is None and len(self._buffer) > 2 * self._side.limits.handshake_frame + len(MAGIC)
                and not self._transport.is_closing()):  # frames within the limit, but more than a handshake's
            self._side.refused["handshake_frame"] += 1
            self._refuse(ProtocolError(f"{len(self._buffer)} bytes sent before the handshake ended (at most "
                                       f"{self._side.limits.handshake_frame} a frame)", size=len(self._buffer)))
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
        size = body_size(bytes(buffer[:HEADER_SIZE]), self._side.max_frame)
        if not welcomed and size > self._side.limits.handshake_frame:
            self._side.refused["handshake_frame"] += 1
            raise ProtocolError(f"frame of {size} bytes before the handshake ended exceeds the handshake's limit of "
                                f"{self._side.limits.handshake_frame} bytes", size=size, limit=self._side.limits.handshake_frame)
        end = HEADER_SIZE + size
        if len(buffer) < end:
            return None
        body = buffer[HEADER_SIZE:end]
        del buffer[:end]
        if welcomed:
            self.since = time.monotonic()
        if end - HEADER_SIZE > self._side.limits.offload_frame:
            task = self._waiting = asyncio.get_running_loop().create_task(asyncio.to_thread(decode, bytes(body)))
            del body
            self._side.requests.add(task)  # a stopping server cancels and awaits it like a request
            task.add_done_callback(self._decoded)
            self._pause_reading_if_needed()
            return None
        return decode(body)

    def _decoded(self, task: asyncio.Task) -> None:
        """A big frame decoded on a worker thread: handle it, then what arrived meanwhile."""
        self._side.requests.discard(task)
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
        size = body_size(bytes(self._buffer[:HEADER_SIZE]), self._side.max_frame)
        return FrameTruncatedError(f"truncated frame: connection closed after {got - HEADER_SIZE} of {size} bytes")

    def _refuse(self, error: RockstateError) -> None:
        """Answer a bad frame, version or secret with an error about the whole connection, and close it."""
        log.warning("server %r closes the connection from %s: %s", self._side.name, self._address, error)
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
            f"server {self._side.name!r} speaks rockstate protocol version {PROTOCOL_VERSION}, which opens with a greeting;"
            f" the client sent {got!r} (an older rockstate client, or not a rockstate client)",
            server_version=PROTOCOL_VERSION)

    def _handshake(self, rid: int, wire: dict) -> None:
        side = self._side
        roles, proof = auth.ROLES, None
        if self._challenge is not None:
            roles, proof = auth.check(side.secret, self._challenge, wire)  # type: ignore[arg-type]
        else:
            if wire.get("op") != Hello.op:
                raise ProtocolError(f"expected {Hello.op!r} first, got {wire.get('op')!r}")
            version = wire.get("version")
            if version != PROTOCOL_VERSION:
                raise ProtocolVersionError(
                    f"client speaks protocol version {version!r}, server {side.name!r} speaks version"
                    f" {PROTOCOL_VERSION}", client_version=version, server_version=PROTOCOL_VERSION)
            hello = Hello.from_wire(wire)
            self._peer = hello.name
            if side.secret is not None:
                self._challenge = auth.new_challenge()
                self._write(encode(reply(rid, self._challenge)))
                return
        self._conn = Connection(peer=self._peer, address=self._address, roles=roles, node=certified_node(self._transport))
        side.connections.welcomed(self)
        self.since = time.monotonic()
        self._write(encode(reply(rid, Welcome(name=side.name, proof=proof))))

    # -- requests ----------------------------------------------------------

    def _request(self, rid: int, wire: dict, deadline: float | None) -> None:
        side = self._side
        if wire.get("op") in side.inline:
            handling = side.handle(self._conn, rid, wire, None)  # type: ignore[arg-type]
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
            task = asyncio.get_running_loop().create_task(side.handle(self._conn, rid, wire, deadline))  # type: ignore[arg-type]
            task.add_done_callback(self._answered)
        self._in_flight += 1
        side.requests.add(task)

    def _answered(self, task: asyncio.Task) -> None:
        self._side.requests.discard(task)
        self._in_flight -= 1
        self.since = time.monotonic()
        if task.cancelled():
            return
        answer = task.result()
        if isinstance(answer, Stream):
            self._streaming = True  # the connection is the stream's now: no more requests are read from it
            self._buffer.clear()
            stream = asyncio.get_running_loop().create_task(self._send(answer))
            self._side.requests.add(stream)
            stream.add_done_callback(self._side.requests.discard)
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
            log.exception("server %r: a stream to %s failed", self._side.name, self._address)
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
