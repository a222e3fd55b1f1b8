"""Clients: the blocking ``Channel`` and ``call_many`` (executors); the asyncio ``AsyncChannel`` (servers) is in
``async_client.py``.

Both raise a server's error as the same rockstate type. Transport failures
raise ``ConnectionLostError`` or ``ClusterTimeoutError`` (both retryable): the
request may or may not have run. Each request carries its timeout to the
server as a deadline; the client waits ``REPLY_GRACE`` longer so the server's
own timeout reply usually wins and the connection stays usable.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import select
import socket
import ssl as _ssl
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NoReturn, TypeVar

from ..errors import (
    ClusterTimeoutError,
    ConfigError,
    ConnectionLostError,
    ProtocolError,
    RockstateError,
    StoreClosedError,
)

from . import auth
from .frames import (GREETING_TIMEOUT, HEADER_SIZE, MAGIC, MAX_FRAME, body_size, check_body, check_greeting, decode, encode,
                     no_greeting, packer)
from .messages import PROTOCOL_VERSION, Challenge, Hello, Message, Welcome, parse_reply, request

REPLY_GRACE = 0.1
_RECEIVE = 64 * 1024  # bytes asked of the socket at a time (a larger buffer is a mmap per receive)
_TIMEVAL = struct.Struct("@ll")  # struct timeval, for SO_RCVTIMEO and SO_SNDTIMEO
T = TypeVar("T")


def split_address(address: object) -> tuple[str, int]:
    """("host", port) from "host:port" ("[v6]:port" too), or a ``ConfigError`` saying what is wrong."""
    host, _, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
    if not isinstance(address, str) or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"address {address!r} must be host:port with a port from 1 to 65535, e.g. "
                          f"{(address.rpartition(':')[0] or address) if isinstance(address, str) and address else 'localhost'}:7700")
    return host.strip("[]"), int(port)


def _transport_error(address: str, e: BaseException, waited: float) -> BaseException:
    """What to raise for an I/O failure: a bad frame as itself, a socket failure as a retryable error."""
    if isinstance(e, ProtocolError) or not isinstance(e, OSError):
        return e
    if _timed_out(e):
        return ClusterTimeoutError(f"no reply from {address} within {waited:g}s", address=address)
    return ConnectionLostError(f"connection to {address} failed: {e}", address=address)


def _timed_out(e: OSError) -> bool:
    """A socket timeout: Python's (TimeoutError), or the kernel's on a blocking socket (EAGAIN)."""
    return isinstance(e, (TimeoutError, BlockingIOError))


HANDSHAKE_FRAME = 64 * 1024
"""Largest frame a client reads before the server is welcomed and proven (its error replies included)."""


def _hello(name: str) -> Hello:
    return Hello(version=PROTOCOL_VERSION, name=name)


def _welcomed(reply: Any) -> None:
    if not isinstance(reply, Welcome):
        raise ProtocolError(f"expected a welcome, got {reply!r}")


class _Connection:
    """One blocking socket with its handshake done, used by one thread at a time.

    A plain socket stays in blocking mode with its timeouts set in the kernel
    (``SO_RCVTIMEO``/``SO_SNDTIMEO``): Python's socket timeouts would add a
    ``poll`` before every send and receive (~15 % of a one-key call's client
    CPU on a loaded machine). A TLS socket keeps Python's timeouts.
    """

    def __init__(self, address: str, timeout: float, ssl: _ssl.SSLContext | None,
                 secret: auth.Secret | None, name: str, max_frame: int) -> None:
        self.address, self.closed, self.busy, self._max_frame = address, False, False, HANDSHAKE_FRAME  # until welcomed
        host, port = split_address(address)
        sock = None
        try:
            sock = socket.create_connection((host, port), timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if ssl:
                self._sock = ssl.wrap_socket(sock, server_hostname=host)
            else:
                self._sock = sock
                sock.settimeout(None)
        except OSError as e:
            if sock is not None:
                sock.close()
            raise _transport_error(address, e, timeout) from e
        self._kernel_timeouts = not ssl
        self._timeout: float | None = None
        self._received = bytearray()  # read from the socket, not yet taken
        self._pack = packer()  # a connection is used by one thread at a time
        self._poll = select.poll()
        self._poll.register(self._sock, select.POLLIN)
        self._ids = itertools.count()
        try:
            reply = self._greet(_hello(name), timeout)
            challenge = proof = None
            if isinstance(reply, Challenge):
                challenge, proof = reply, auth.answer(secret, reply)
                reply = self.call(proof, timeout)
            _welcomed(reply)
            auth.check_welcome(secret, challenge, proof, reply)
            self._max_frame = max_frame
        except BaseException:
            self.close()
            raise

    def _greet(self, hello: Hello, timeout: float) -> Any:
        """The greeting and the hello in one write; the server's greeting must come back within a second."""
        try:
            self._settimeout(timeout)
            self._sock.sendall(MAGIC)
        except BaseException as e:
            self._fail(e, timeout)
        rid = self.send(hello, timeout)
        waited = min(timeout, GREETING_TIMEOUT)
        try:
            self._settimeout(waited)
            got = self._take(len(MAGIC))
        except OSError as e:
            self.close()
            if _timed_out(e):
                raise no_greeting(self.address, waited) from None
            raise _transport_error(self.address, e, waited) from e
        check_greeting(got, self.address)
        result = self.receive(rid, timeout + REPLY_GRACE)
        if isinstance(result, RockstateError):
            raise result
        return result

    def stale(self) -> bool:
        """Whether the server closed this idle connection: an idle socket has nothing to read."""
        return bool(self._poll.poll(0))

    def call(self, msg: Message, timeout: float) -> Any:
        """Send ``msg`` and return its result, or raise the server's error (one timeout for both ways)."""
        result = self.receive(self.send(msg, timeout, timeout + REPLY_GRACE), timeout + REPLY_GRACE)
        if isinstance(result, RockstateError):
            raise result
        return result

    def send(self, msg: Message, timeout: float, io_timeout: float | None = None) -> int:
        """Send ``msg`` with ``timeout`` as its deadline; return its request id."""
        rid = next(self._ids)
        frame = encode(request(rid, msg, timeout), self._max_frame, self._pack)  # a too-large request spoils nothing
        try:
            self._settimeout(timeout if io_timeout is None else io_timeout)
            self._sock.sendall(frame)
        except BaseException as e:
            self._fail(e, timeout)
        self.busy = True  # a reply is on its way: nobody else may use the connection before it is read
        return rid

    def receive(self, rid: int, timeout: float) -> Any:
        """The result of request ``rid``; a server error is returned, not raised."""
        try:
            self._settimeout(max(timeout, 1e-3))  # 0 would mean non-blocking
            size = body_size(self._take(HEADER_SIZE), self._max_frame)
            got, result = parse_reply(decode(check_body(self._take(size), size)))
        except BaseException as e:
            self._fail(e, timeout)
        self.busy = False
        if got != rid:
            self.close()
            if got is None and isinstance(result, RockstateError):
                return result  # the server closed the connection with this error
            raise ProtocolError(f"{self.address} answered request {got!r} instead of {rid}")
        return result

    def _take(self, n: int) -> bytes | bytearray:
        """The next ``n`` bytes from the socket (fewer if it closed); one receive usually brings a whole reply."""
        received = self._received
        while len(received) < n:
            if n - len(received) > _RECEIVE:  # a large frame: the rest straight into its own buffer
                return self._take_large(n)
            chunk = self._sock.recv(_RECEIVE)
            if not chunk:
                break
            received += chunk
        data = bytes(received[:n])
        del received[:n]
        return data

    def _take_large(self, n: int) -> bytearray:
        data = bytearray(n)
        got = len(self._received)
        data[:got] = self._received
        self._received.clear()
        with memoryview(data) as view:
            while got < n:
                count = self._sock.recv_into(view[got:])
                if not count:
                    return data[:got]
                got += count
        return data

    def read_into(self, view: memoryview) -> int:
        """Raw bytes after an answer (a ``Stream``'s) into ``view``; their count, 0 at the stream's end."""
        if self._received:
            n = min(len(view), len(self._received))
            view[:n] = self._received[:n]
            del self._received[:n]
            return n
        try:
            return self._sock.recv_into(view)
        except BaseException as e:
            self._fail(e, self._timeout or 0.0)

    def shutdown(self) -> None:
        """Wake a thread reading from this connection: its read fails (from another thread)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def _settimeout(self, timeout: float) -> None:
        if timeout == self._timeout:  # each change is a system call (two with kernel timeouts)
            return
        if self._kernel_timeouts:
            seconds = int(timeout)
            value = _TIMEVAL.pack(seconds, max(int((timeout - seconds) * 1e6), 0 if seconds else 1))  # 0 s: none at all
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
        else:
            self._sock.settimeout(timeout)
        self._timeout = timeout

    def _fail(self, e: BaseException, timeout: float) -> NoReturn:
        """A connection whose I/O failed midway is out of step: close it; raise what the caller should see."""
        self.close()
        error = _transport_error(self.address, e, timeout)
        if error is e:
            raise e
        raise error from e

    def close(self) -> None:
        self.closed = True
        self._sock.close()


def streamed(conn: _Connection, msg: Message, consume: Callable[[Any, Callable[[memoryview], int]], T],
             timeout: float, read_timeout: float) -> T:
    """Ask ``conn`` for ``msg``, whose handler answers a ``server.Stream``; ``consume(result, read_into)`` takes the
    stream's bytes (``read_into(view)``: their count, 0 at the end; each read waits at most ``read_timeout``).
    Answers what ``consume`` answers; the connection is spent and closed."""
    try:
        result = conn.call(msg, timeout)
        conn._settimeout(read_timeout)
        return consume(result, conn.read_into)
    finally:
        conn.close()


class Channel:
    """Blocking, thread-safe client of one server, for Spark executors.

    A thread takes an idle connection (or opens one), makes its call and puts
    it back; at most ``max_idle`` connections stay open.
    """

    def __init__(self, address: str, *, timeout: float = 10.0, ssl: _ssl.SSLContext | None = None,
                 secret: auth.Secret | None = None, name: str = "client", max_frame: int = MAX_FRAME,
                 max_idle: int = 8) -> None:
        self.address, self.timeout, self.name = address, timeout, name
        self._ssl, self._secret, self._max_frame, self._max_idle = ssl, secret, max_frame, max_idle
        self._idle: collections.deque[_Connection] = collections.deque()  # append/pop are atomic
        self._closed = False

    def call(self, msg: Message, timeout: float | None = None) -> Any:
        """Send ``msg`` and return the server's result, or raise its error."""
        timeout = self.timeout if timeout is None else timeout
        conn = self._take_connection(timeout)
        try:
            return conn.call(msg, timeout)
        finally:
            self._give_back(conn)

    @contextlib.contextmanager
    def _connection(self, timeout: float) -> Iterator[_Connection]:
        conn = self._take_connection(timeout)
        try:
            yield conn
        finally:
            self._give_back(conn)

    def _take_connection(self, timeout: float) -> _Connection:
        if self._closed:
            raise StoreClosedError(f"the channel to {self.address} is closed")
        return self._idle_connection() or _Connection(
            self.address, timeout, self._ssl, self._secret, self.name, self._max_frame)

    def _give_back(self, conn: _Connection) -> None:
        if conn.closed or conn.busy or len(self._idle) >= self._max_idle:
            conn.close()
        else:
            self._idle.append(conn)
            if self._closed:  # close() ran meanwhile
                self.close()

    def _idle_connection(self) -> _Connection | None:
        while True:
            try:
                conn = self._idle.pop()
            except IndexError:
                return None
            if not conn.stale():
                return conn
            conn.close()

    def close(self) -> None:
        self._closed = True
        while True:
            try:
                self._idle.pop().close()
            except IndexError:
                return

    def __enter__(self) -> Channel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def call_many(calls: Iterable[tuple[Channel, Message]], timeout: float | None = None) -> list[Any]:
    """Make several calls at once, each on its channel, and return their results in order.

    Every request is written before any reply is read, so calls to different
    servers overlap and the batch costs about one round trip. A failed call's
    error takes its place in the list instead of being raised.
    """
    results: list[Any] = []
    sent = []
    with contextlib.ExitStack() as stack:
        for i, (channel, msg) in enumerate(calls):
            t = channel.timeout if timeout is None else timeout
            results.append(None)
            try:
                conn = stack.enter_context(channel._connection(t))
                sent.append((i, conn, conn.send(msg, t), time.monotonic() + t + REPLY_GRACE))
            except RockstateError as e:
                results[i] = e
        for i, conn, rid, until in sent:
            try:
                results[i] = conn.receive(rid, until - time.monotonic())
            except RockstateError as e:
                results[i] = e
    return results
