"""Length-prefixed msgpack frames: a 4-byte big-endian body length, then the body.

One encoder and decoder shared by the asyncio side (servers, ``AsyncChannel``)
and the blocking side (``Channel``). Every way a frame can be bad raises
``ProtocolError``; a peer that closes cleanly between frames raises
``ConnectionLostError``.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any, BinaryIO

import msgpack

from rockstate.errors import ConnectionLostError, FrameTruncatedError, ProtocolError

MAX_FRAME = 256 * 1024 * 1024
"""Default largest frame body, in bytes, that a peer sends or accepts."""

_HEADER = struct.Struct(">I")


def encode(obj: Any, max_frame: int = MAX_FRAME) -> bytes:
    """The whole frame (header and body) for ``obj``."""
    try:
        body = msgpack.packb(obj, use_bin_type=True)
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


def _body_size(header: bytes, max_frame: int) -> int:
    if not header:
        raise ConnectionLostError("connection closed by peer")
    if len(header) < _HEADER.size:
        raise FrameTruncatedError(f"truncated frame: connection closed after {len(header)} header bytes")
    (size,) = _HEADER.unpack(header)
    if size > max_frame:
        raise ProtocolError(f"frame of {size} bytes exceeds the limit of {max_frame} bytes",
                            size=size, limit=max_frame)
    return size


def _check_body(body: bytes, size: int) -> bytes:
    if len(body) < size:
        raise FrameTruncatedError(f"truncated frame: connection closed after {len(body)} of {size} bytes")
    return body


# -- asyncio streams ---------------------------------------------------------


async def read_frame(reader: asyncio.StreamReader, max_frame: int = MAX_FRAME) -> Any:
    try:
        header = await reader.readexactly(_HEADER.size)
    except asyncio.IncompleteReadError as e:
        header = e.partial
    size = _body_size(header, max_frame)
    try:
        body = await reader.readexactly(size)
    except asyncio.IncompleteReadError as e:
        body = e.partial
    return decode(_check_body(body, size))


async def write_frame(writer: asyncio.StreamWriter, obj: Any, max_frame: int = MAX_FRAME) -> None:
    writer.write(encode(obj, max_frame))  # one write per frame: concurrent writers never interleave
    await writer.drain()


# -- blocking sockets --------------------------------------------------------


def read_frame_sync(stream: BinaryIO, max_frame: int = MAX_FRAME) -> Any:
    """Read one frame from a buffered reader over a socket (``sock.makefile("rb")``).

    The buffer usually gets header and body in one ``recv``.
    """
    size = _body_size(stream.read(_HEADER.size), max_frame)
    return decode(_check_body(stream.read(size), size))


def write_frame_sync(sock: socket.socket, obj: Any, max_frame: int = MAX_FRAME) -> None:
    sock.sendall(encode(obj, max_frame))
