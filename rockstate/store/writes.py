"""A partition's write ops as entries of a RocksDB WriteBatch (``to_batch``), and as its backups get them.

Keys go behind the partition's 4-byte prefix (``keygroups.py``). A value of a state with a TTL is stored behind an
8-byte expiry header (milliseconds since the epoch, big-endian). A list state's value is its items' encodings
concatenated: an ``APPEND`` reads what the batch so far, or the partition, holds. What a primary ships is each op
as stored: values with their headers (``RAW_PUT``, ``RAW_PUT_MANY``), so a backup stores the same bytes; an append
as its item (the whole list only in a TTL state, whose expiry is the primary's clock's); a prefix deletion as the
range it deleted.
"""

from __future__ import annotations

import struct
import time
from collections import deque
from itertools import accumulate, repeat
from typing import Any, Callable, Iterable, Protocol, Sequence

from rocksdict import WriteBatch

from ..ops import APPEND, DELETE, DELETE_MANY, DELETE_PREFIX, DELETE_RANGE, PUT, PUT_MANY, RAW_PUT, RAW_PUT_MANY, Op


class KeyGroup(Protocol):
    """What ``to_batch`` needs of a partition."""

    prefix: bytes  # its keys' (keygroups.bounds)
    end: bytes  # the first key past them

    def state_kind(self, state: str) -> tuple[Any, int | None, bool]: ...  # (column family handle, TTL ms, is a list)

    def get_many(self, state: str, keys: list[bytes]) -> list[bytes | None]: ...

EXPIRY = struct.Struct(">Q")


def now_ms() -> int:
    return int(time.time() * 1000)


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with ``prefix`` (None: no bound)."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return None
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


STORED_OP_BYTES = 180  # what a stored op's tuple and its slot weigh in memory
STORED_ITEM_BYTES = 48  # a key's or value's bytes object and its list slot, beside its length


def stored_bytes(stored: list) -> int:
    """Roughly what a stored batch weighs in memory, kept in a replica's log or tail: its keys and values, and
    Python's own per object (a bytes object and its list slot per key or value; a tuple per op); within a few
    percent of tracemalloc's count for batches of 1 to 280 keys. On the wire it weighs less."""
    size = STORED_OP_BYTES * len(stored)
    for op in stored:  # run per batch on both replicas: type checks, not isinstance, and no slice (3.3 -> 2.3 µs)
        for part in (op[2], op[3]):
            kind = type(part)
            if kind is bytes:
                size += len(part)
            elif kind is list or kind is tuple:
                try:  # a C loop: a generator per key was 2 % of a node's put time at P=271
                    size += sum(map(len, part)) + STORED_ITEM_BYTES * len(part)
                except TypeError:
                    size += sum(len(x) for x in part if x is not None) + STORED_ITEM_BYTES * len(part)
            elif part is not None:
                size += len(part)
    return size


def put_pieces_bytes(counts: Iterable[int], keys: Iterable, values: Iterable, request: bytes | None, written: bytes) -> list[int]:
    """``stored_bytes`` of each batch put's piece of a run (``counts[i]`` of ``keys`` and ``values`` each, in order)
    as shipped, [RAW_PUT_MANY of its keys and values] and, with a ``request`` id, its record's RAW_PUT (value
    ``written``), from running sums of their lengths: C loops over the keys (the generic walk, then a call per
    piece, was 2 % of a node's puts at P=1024). TypeError: a key or value without a length."""
    key_ends = list(accumulate(map(len, keys), initial=0))
    value_ends = list(accumulate(map(len, values), initial=0))
    ends = list(accumulate(counts, initial=0))
    fixed = STORED_OP_BYTES if request is None else 2 * STORED_OP_BYTES + len(request) + len(written)
    return [fixed + key_ends[b] - key_ends[a] + value_ends[b] - value_ends[a] + 2 * STORED_ITEM_BYTES * (b - a)
            for a, b in zip(ends, ends[1:])]


def each(call: Callable[..., object], *columns: Iterable[Any]) -> None:
    """``call`` on each row of the columns, in a C loop: rocksdict's WriteBatch has no bulk put, and a Python
    loop's own work was a fifth of 1,000 puts' time (218 -> 173 µs)."""
    deque(map(call, *columns), maxlen=0)


def to_batch(part: KeyGroup, ops: Sequence[Op], batch: WriteBatch, stored: list | None = None) -> None:
    """``part``'s ops added to ``batch``, keys behind its prefix; ``stored`` (a list) gets them as stored, without
    it, for the backups."""
    p = part.prefix
    pending: dict[tuple[str, bytes], bytes | None] = {}  # list values as this batch leaves them (list states)
    for op, state, key, value in ops:
        handle, ttl, listed = part.state_kind(state)
        header = EXPIRY.pack(now_ms() + ttl) if ttl else None
        as_stored = (op, state, key, value)
        if op == PUT_MANY:
            values = [header + v for v in value] if header else value
            each(batch.put, [p + k for k in key], values, repeat(handle))
            if listed:
                pending.update(zip(zip(repeat(state), key), value))
            as_stored = (RAW_PUT_MANY, state, key, values)
        elif op == RAW_PUT_MANY:  # a backup applying its primary's batch
            each(batch.put, [p + k for k in key], value, repeat(handle))
            if listed:
                pending.update(zip(zip(repeat(state), key), [v[8:] for v in value] if ttl else value))
        elif op == RAW_PUT:
            batch.put(p + key, value, handle)
            if listed:
                pending[state, key] = value[8:] if ttl and value is not None else value
        elif op == PUT:
            stored_value = header + value if header else value
            batch.put(p + key, stored_value, handle)
            if listed:
                pending[state, key] = value
            as_stored = (RAW_PUT, state, key, stored_value)
        elif op == DELETE_MANY:
            each(batch.delete, [p + k for k in key], repeat(handle))
            if listed:
                pending.update(zip(zip(repeat(state), key), repeat(None)))
        elif op == DELETE:
            batch.delete(p + key, handle)
            if listed:
                pending[state, key] = None
        elif op == APPEND:
            old = pending[state, key] if (state, key) in pending else part.get_many(state, [key])[0]
            pending[state, key] = new = (old or b"") + value
            batch.put(p + key, header + new if header else new, handle)
            if header:  # the expiry is the primary's clock's: the whole value (without TTL a backup appends alike)
                as_stored = (RAW_PUT, state, key, header + new)
        elif op == DELETE_RANGE:
            batch.delete_range(p + key, p + value, handle)
        elif op == DELETE_PREFIX:
            end = prefix_end(key)
            if end is None:  # empty or only 0xff bytes: to the end of the partition's range
                batch.delete_range(p + key, part.end, handle)
                as_stored = (DELETE_PREFIX, state, key, None)
            else:
                batch.delete_range(p + key, p + end, handle)
                as_stored = (DELETE_RANGE, state, key, end)
        else:
            raise ValueError(f"unknown write op {op!r}")
        if stored is not None:
            stored.append(as_stored)
