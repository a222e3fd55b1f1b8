"""Request ids: a write or compare-and-set that a client retries is applied once.

A reply lost on its way back (a dropped connection, a node killed after it
applied) leaves the client unable to tell whether its request applied, so it
sends it again. Applied twice, an APPEND doubles its items, and a PUT lands
again after another client's later write to the same key. So the cluster
client names each write and compare-and-set with an id that it keeps across
its retries: 8 bytes of its clock (milliseconds, big-endian), then 8 random
bytes. The owner stores the id in the partition's ``_requests`` column family
in the same WriteBatch as the request's ops, with a compare-and-set's answer
as its value; a request whose id is there is answered from it instead
(``Partition.write`` and ``Partition.compare_and_set`` do this).

The ids live in the partition's RocksDB, so they move with it (a move hands
them over like any write) and are in its checkpoints: after a failover, a
request lost with the writes since the checkpoint is lost with its id, and
its retry applies it once.

Ids are forgotten ``window`` seconds after the time in them, by one range
delete (they sort by time). A client stops retrying long before: its
``retry_timeout`` is 30 s by default, the node's ``request_window`` 300 s, so
clocks may be minutes apart.
"""

from __future__ import annotations

import random
import struct
import time

from ..errors import ProtocolError

REQUESTS = "_requests"
ID_BYTES = 16
_CLOCK = struct.Struct(">Q")
_ID = struct.Struct(">QQ")
WRITTEN, SET, NOT_SET = b"w", b"\x01", b"\x00"  # what an id is stored with: a write's, a compare-and-set's outcome


def new_id() -> bytes:
    # random reseeds itself in a forked child (Spark's Python workers fork), so children draw apart
    return _ID.pack(int(time.time() * 1000), random.getrandbits(64))


def check_id(request: object, op: str) -> None:
    if request is not None and (type(request) is not bytes or len(request) != ID_BYTES):
        raise ProtocolError(f"field 'request' of {op!r} message must be None or {ID_BYTES} bytes "
                            f"(8 of the client's clock in ms, 8 random), not {request!r:.60}", op=op, field="request")


def cutoff(window: float, now: float | None = None) -> bytes:
    """The smallest id still kept: ids sort by their time, so older ones go by one range delete."""
    return _CLOCK.pack(max(0, int(((time.time() if now is None else now) - window) * 1000)))
