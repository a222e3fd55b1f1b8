"""What a server's handlers and connections share: ``Connection`` (what a handler knows about its caller),
``Stream`` (a handler's answer followed by raw bytes), and ``Limits``.

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
frames wait for it), so one big frame does not hold the loop. ``serving``
enforces them, one connection at a time; the server sweeps its connections
for the timeouts once a second and counts what the limits closed
(``Server.refused``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from . import auth


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


NODE_URI = "rockstate:node:"
"""A certificate binds its holder to a node id with a subjectAltName URI ``rockstate:node:<id>`` (docs/security.md)."""


def certified_node(transport: asyncio.BaseTransport) -> str | None:
    """The node id the caller's verified TLS certificate names, if it names one."""
    cert = transport.get_extra_info("peercert") if transport.get_extra_info("sslcontext") is not None else None
    for kind, value in (cert or {}).get("subjectAltName", ()):
        if kind == "URI" and value.startswith(NODE_URI):
            return value[len(NODE_URI):]
    return None


def format_address(sockname: tuple) -> str:
    host, port = sockname[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
