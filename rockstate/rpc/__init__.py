"""RPC: msgpack frames over asyncio streams and blocking sockets, generic over operations.

The cluster layer defines its operations as ``Message`` subclasses and serves
them with a ``Server`` per role; clients call them through ``Channel``
(blocking), ``call_many`` (one round trip to several servers) or ``AsyncChannel``.
A handler that answers a ``Stream`` (a bulk transfer: raw bytes after its
result) is called with ``AsyncChannel.stream``.
"""

from .async_client import AsyncChannel
from .client import Channel, call_many
from .frames import MAX_FRAME
from .messages import PROTOCOL_VERSION, Message
from .server import Connection, Server, Stream

__all__ = ["MAX_FRAME", "PROTOCOL_VERSION", "AsyncChannel", "Channel", "Connection", "Message", "Server", "Stream", "call_many"]
