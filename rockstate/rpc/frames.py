"""Length-prefixed msgpack frames: a 4-byte big-endian body length, then the body.

Every connection starts with ``MAGIC``, both ways (the client's first, the
server's in answer), before any frame: a client that reached something other
than a rockstate server (an HTTP, status page or metrics port) says so within
``GREETING_TIMEOUT`` instead of reading an HTTP reply as a frame length or
waiting for a reply that never comes.

One encoder and decoder shared by the asyncio side (servers, ``AsyncChannel``)
and the blocking side (``Channel``). Every way a frame can be bad raises
``ProtocolError``; a peer that closes cleanly between frames raises
``ConnectionLostError``.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any, BinaryIO, Callable

import msgpack

from ..errors import ClusterTimeoutError, ConnectionLostError, FrameTruncatedError, NotRockstateError, ProtocolError

MAX_FRAME = 256 * 1024 * 1024
"""Default largest frame body, in bytes, that a peer sends or accepts."""

_HEADER = struct.Struct(">I")
HEADER_SIZE = _HEADER.size

MAGIC = b"RKS\x01"
"""The greeting that opens a connection, both ways (its last byte changes only with an incompatible framing)."""

GREETING_TIMEOUT = 1.0
"""Seconds a client waits for the server's greeting: a server answers it at once, before reading any frame."""


def check_greeting(got: bytes, address: str) -> None:
    """Raise unless ``got`` (what the peer at ``address`` sent first) is the rockstate greeting."""
    if got == MAGIC:
        return
    if not got:
        raise ConnectionLostError(f"{address} closed the connection without the rockstate greeting: it is not a rockstate "
                                  "port, or it expects TLS (give the cluster's CA file), or it is shutting down", address=address)
    what = "an HTTP server (the status page or a metrics port?)" if got.startswith(b"HTTP") else "not a rockstate server"
    raise NotRockstateError(f"{address} answered {got!r} to the rockstate greeting: it is {what}; "
                            "give the address of a rockstate coordinator or node RPC port", address=address)


def no_greeting(address: str, waited: float) -> ClusterTimeoutError:
    return ClusterTimeoutError(f"{address} did not answer the rockstate greeting within {waited:g}s: it is not a rockstate "
                               "RPC port (an HTTP or metrics port?), or it is overloaded", address=address)


async def read_greeting(reader: asyncio.StreamReader, address: str, timeout: float = GREETING_TIMEOUT) -> None:
    try:
        async with asyncio.timeout(timeout):
            got = await reader.readexactly(len(MAGIC))
    except asyncio.IncompleteReadError as e:
        got = e.partial
    except TimeoutError:
        raise no_greeting(address, timeout) from None
    check_greeting(got, address)


def packer() -> Callable[[Any], bytes]:
    """A reusable msgpack encoder for ``encode``, for one thread at a time: ``msgpack.packb`` builds a Packer
    per call, which cost ~3 µs of a small frame's ~3.5."""
    return msgpack.Packer(use_bin_type=True).pack


def encode(obj: Any, max_frame: int = MAX_FRAME, pack: Callable[[Any], bytes] | None = None) -> bytes:
    """The whole frame (header and body) for ``obj``; ``pack``: the caller's own ``packer()``."""
    try:
        body = msgpack.packb(obj, use_bin_type=True) if pack is None else pack(obj)
    except (TypeError, ValueError, OverflowError) as e:
        raise ProtocolError(f"cannot encode frame: {e}") from e
    if len(body) > max_frame:
        raise ProtocolError(f"frame of {len(body)} bytes exceeds the limit of {max_frame} bytes",
                            size=len(body), limit=max_frame)
    return _HEADER.pack(len(body)) + body


def decode(body: bytes) -> Any:
    try:
        # strict_map_key=False: results may be keyed by ints (partition ids).
        return msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises a handful of unrelated types
        raise ProtocolError(f"undecodable frame of {len(body)} bytes (a frame body is one msgpack value):"
                            f" {type(e).__name__}: {e}") from e


def body_size(header: bytes, max_frame: int) -> int:
    if not header:
        raise ConnectionLostError("connection closed by peer")
    if len(header) < _HEADER.size:
        raise FrameTruncatedError(f"truncated frame: connection closed after {len(header)} header bytes")
    (size,) = _HEADER.unpack(header)
    if size > max_frame:
        raise ProtocolError(f"frame of {size} bytes exceeds the limit of {max_frame} bytes",
                            size=size, limit=max_frame)
    return size


def check_body(body: bytes, size: int) -> bytes:
    if len(body) < size:
        raise FrameTruncatedError(f"truncated frame: connection closed after {len(body)} of {size} bytes")
    return body


# -- asyncio streams ---------------------------------------------------------


async def read_frame(reader: asyncio.StreamReader, max_frame: int = MAX_FRAME) -> Any:
    try:
        header = await reader.readexactly(_HEADER.size)
    except asyncio.IncompleteReadError as e:
        header = e.partial
    size = body_size(header, max_frame)
    try:
        body = await reader.readexactly(size)
    except asyncio.IncompleteReadError as e:
        body = e.partial
    return decode(check_body(body, size))


async def write_frame(writer: asyncio.StreamWriter, obj: Any, max_frame: int = MAX_FRAME) -> None:
    writer.write(encode(obj, max_frame))  # one write per frame: concurrent writers never interleave
    await writer.drain()


# -- blocking sockets --------------------------------------------------------


def read_frame_sync(stream: BinaryIO, max_frame: int = MAX_FRAME) -> Any:
    """Read one frame from a buffered reader over a socket (``sock.makefile("rb")``).

    The buffer usually gets header and body in one ``recv``.
    """
    size = body_size(stream.read(_HEADER.size), max_frame)
    return decode(check_body(stream.read(size), size))


def write_frame_sync(sock: socket.socket, obj: Any, max_frame: int = MAX_FRAME) -> None:
    sock.sendall(encode(obj, max_frame))
