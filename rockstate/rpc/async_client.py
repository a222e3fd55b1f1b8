"""The asyncio client, ``AsyncChannel``: server-to-server calls (errors and timeouts as ``client.py`` says)."""

from __future__ import annotations

import asyncio
import itertools
import socket
import ssl as _ssl
import threading
from typing import Any, Callable

from ..errors import ProtocolError, RockstateError, StoreClosedError

from . import auth
from .client import HANDSHAKE_FRAME, REPLY_GRACE, T, _Connection, _hello, _transport_error, _welcomed, split_address, streamed
from .frames import GREETING_TIMEOUT, MAGIC, MAX_FRAME, encode, read_frame, read_greeting, write_frame
from .messages import Challenge, Message, parse_reply, request

# A server-to-server connection whose data has gone unacknowledged this long is dead: the kernel drops it, and
# the next call reconnects. Without it, after a cut link heals, calls queue behind data TCP resends only when its
# backed-off retransmission timer fires (seconds to minutes later). A slow server's kernel still acknowledges.
UNACKNOWLEDGED_MS = 5000


class AsyncChannel:
    """asyncio client of one server, for server-to-server calls.

    One connection carries any number of concurrent calls, matched to their
    replies by id. After the connection fails, the next call reconnects.
    """

    def __init__(self, address: str, *, timeout: float = 10.0, ssl: _ssl.SSLContext | None = None,
                 secret: auth.Secret | None = None, name: str = "client", max_frame: int = MAX_FRAME) -> None:
        self.address, self.timeout, self.name = address, timeout, name
        self._ssl, self._secret, self._max_frame = ssl, secret, max_frame
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task | None = None
        self._replies: dict[int, asyncio.Future] = {}
        self._ids = itertools.count(1)
        self._connecting = asyncio.Lock()
        self._closed = False

    async def call(self, msg: Message, timeout: float | None = None) -> Any:
        """Send ``msg`` and return the server's result, or raise its error."""
        timeout = self.timeout if timeout is None else timeout
        writer = self._writer if self._writer is not None and not self._closed else await self._connected(timeout)
        rid = next(self._ids)
        frame = encode(request(rid, msg, timeout), self._max_frame)
        reply = self._replies[rid] = asyncio.get_running_loop().create_future()
        # a timer on the reply rather than asyncio.timeout(): replication makes a call per write, and the timers
        # made per single put (this one, the sender's, the write's wait) were a tenth of a primary's time
        expiry = reply.get_loop().call_later(timeout + REPLY_GRACE, _expire, reply)
        try:
            writer.write(frame)
            if writer.transport.get_write_buffer_size():  # the kernel's buffer is full: wait until it drains
                async with asyncio.timeout(timeout + REPLY_GRACE):
                    await writer.drain()
            result = await reply
        except OSError as e:  # the reader fails pending replies when the connection drops; TimeoutError is one
            raise _transport_error(self.address, e, timeout) from e
        finally:
            expiry.cancel()
            del self._replies[rid]
        if isinstance(result, BaseException):  # a server error, or the reader's news of a lost connection
            raise result
        return result

    async def stream(self, msg: Message, consume: Callable[[Any, Callable[[memoryview], int]], T],
                     timeout: float | None = None, read_timeout: float | None = None) -> T:
        """A call whose handler answers a ``server.Stream`` (a bulk transfer), on a connection of its own in a worker
        thread, so that its bytes never pass through the event loop: see ``client.streamed``. ``read_timeout``
        (default: the channel's) bounds the connection's set-up and each read of the stream, ``timeout`` its answer."""
        timeout = self.timeout if timeout is None else timeout
        read_timeout = read_timeout or self.timeout
        if self._closed:
            raise StoreClosedError(f"the channel to {self.address} is closed")
        opened: list[_Connection] = []
        cancelled = threading.Event()

        def run() -> T:
            conn = _Connection(self.address, min(timeout, read_timeout), self._ssl, self._secret, self.name, self._max_frame)
            opened.append(conn)
            if cancelled.is_set():  # while it connected
                conn.close()
                raise StoreClosedError(f"the stream from {self.address} was cancelled")
            return streamed(conn, msg, consume, timeout, read_timeout)

        reading = asyncio.ensure_future(asyncio.to_thread(run))
        try:
            return await asyncio.shield(reading)
        except asyncio.CancelledError:
            cancelled.set()
            for conn in opened:
                conn.shutdown()  # the thread's next read fails, and it closes the connection
            reading.add_done_callback(lambda f: f.cancelled() or f.exception())  # that failure is nobody's news
            raise

    async def _connected(self, timeout: float) -> asyncio.StreamWriter:
        async with self._connecting:
            if self._closed:
                raise StoreClosedError(f"the channel to {self.address} is closed")
            if self._writer is None:
                await self._connect(timeout)
            return self._writer  # type: ignore[return-value]

    async def _connect(self, timeout: float) -> None:
        host, port = split_address(self.address)
        writer = None
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(host, port, ssl=self._ssl)
                writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, UNACKNOWLEDGED_MS)
                writer.write(MAGIC)
                reply = await self._handshake_step(reader, writer, _hello(self.name), greeting=min(timeout, GREETING_TIMEOUT))
                challenge = proof = None
                if isinstance(reply, Challenge):
                    challenge, proof = reply, auth.answer(self._secret, reply)
                    reply = await self._handshake_step(reader, writer, proof)
                _welcomed(reply)
                auth.check_welcome(self._secret, challenge, proof, reply)
        except BaseException as e:
            if writer is not None:
                writer.close()
            error = _transport_error(self.address, e, timeout)
            if error is e:
                raise
            raise error from e
        self._writer = writer
        self._reader_task = asyncio.create_task(self._read_replies(reader, writer))

    async def _handshake_step(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                              msg: Message, greeting: float | None = None) -> Any:
        await write_frame(writer, request(0, msg, None), self._max_frame)
        if greeting is not None:
            await read_greeting(reader, self.address, greeting)
        _, result = parse_reply(await read_frame(reader, HANDSHAKE_FRAME))  # the server is not proven yet: nothing big
        if isinstance(result, RockstateError):
            raise result
        return result

    async def _read_replies(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                rid, result = parse_reply(await read_frame(reader, self._max_frame))
                if rid is None:  # an error about the whole connection: the server closes it
                    raise result if isinstance(result, RockstateError) else ProtocolError(f"bad reply {result!r}")
                reply = self._replies.get(rid)
                if reply is not None and not reply.done():
                    reply.set_result(result)
        except Exception as e:
            self._disconnect(writer, _transport_error(self.address, e, self.timeout))

    def _disconnect(self, writer: asyncio.StreamWriter, error: BaseException) -> None:
        writer.close()
        if self._writer is writer:
            self._writer = None
        for reply in self._replies.values():
            if not reply.done():
                reply.set_result(error)  # call() raises it

    async def close(self) -> None:
        self._closed = True
        if self._writer is not None:
            self._disconnect(self._writer, StoreClosedError(f"the channel to {self.address} is closed"))
            self._reader_task.cancel()  # type: ignore[union-attr]
            await asyncio.wait([self._reader_task])  # type: ignore[list-item]

    async def __aenter__(self) -> AsyncChannel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _expire(reply: asyncio.Future) -> None:
    if not reply.done():
        reply.set_exception(TimeoutError())
