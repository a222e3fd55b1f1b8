"""The asyncio RPC server: one dict of handlers per role, a task per request.

Each connection starts with the handshake (see ``messages``); after it every
request runs in its own task, so a slow request never holds up the others on
its connection. A handler's ``RockstateError`` reaches the caller as itself,
any other exception as a ``RockstateError`` naming its type (the traceback is
logged here). A bad frame, protocol version or secret closes that connection
only, after an error reply when the socket still takes one.

A connection is an ``asyncio.Protocol`` fed by the loop (``serving``): a
request that is answered without waiting costs no future, task or turn of
the loop. A handler may answer a ``Stream`` (``connection``).

Nothing large before the handshake (docs/security.md, ``Limits``: described
in ``connection``): each connection enforces the limits on its frames, its
buffer and the number of connections open and in their handshake; the server
closes, once a second, those past their handshake, read or idle timeout, and
counts in ``refused`` the connections the limits closed, by reason.
"""

from __future__ import annotations

import asyncio
import logging
import ssl as _ssl
from collections.abc import Iterable
from typing import Any

from ..errors import ClusterTimeoutError, PermissionDeniedError, ProtocolError, RockstateError, UnknownOperationError

from . import auth
from .connection import NODE_URI, Connection, Handler, Limits, Stream, format_address
from .frames import MAX_FRAME, encode, packer
from .messages import Message, error_reply, reply
from .serving import Connections, ServerSide, Serving

__all__ = ["NODE_FIELDS", "NODE_URI", "Connection", "Handler", "Limits", "Server", "Stream"]

log = logging.getLogger(__name__)

NODE_FIELDS = ("node_id", "node")  # a message's fields that say which node it speaks for


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
        self._connections = Connections()  # open, and which are still in their handshake
        self._requests: set[asyncio.Task] = set()
        self.limits = limits
        self._sweeper: asyncio.TimerHandle | None = None
        self.refused = {"handshake_frame": 0, "handshake_timeout": 0, "unauthenticated_cap": 0, "connection_cap": 0,
                        "read_timeout": 0, "idle_timeout": 0}  # connections closed by the limits, by reason
        # what its connections use of the server: the same objects, under public names
        self._side = ServerSide(name=name, handle=self._handle, inline=self._inline, secret=secret, max_frame=max_frame,
                                limits=limits, refused=self.refused, connections=self._connections, requests=self._requests)

    async def start(self) -> None:
        loop, side = asyncio.get_running_loop(), self._side
        self._server = await loop.create_server(lambda: Serving(side), self.host, self.port, ssl=self._ssl,
                                                ssl_handshake_timeout=self.limits.handshake_timeout if self._ssl else None)
        self.port = self._server.sockets[0].getsockname()[1]
        self._sweeper = loop.call_later(1.0, self._sweep)

    def _sweep(self) -> None:
        """Once a second: close connections past their handshake, read or idle timeout."""
        self._connections.sweep(self.limits)
        if self._server is not None:
            self._sweeper = asyncio.get_running_loop().call_later(1.0, self._sweep)

    @property
    def address(self) -> str:
        """ "host:port" with the bound port; valid after ``start()``."""
        return format_address((self.host, self.port))

    async def stop(self) -> None:
        """Stop listening, close every connection and cancel the requests in flight."""
        if self._server is None:
            return
        self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        self._connections.close()
        while self._requests:  # until none is left: a cancelled request may start the stream it answered with
            for task in self._requests:
                task.cancel()
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
