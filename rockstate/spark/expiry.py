"""Spark's TTL cleanup: expired state entries deleted at the end of the batch that finds them expired.

A state with a TTL stores each value with its expiry (``values``); a read at
or after the expiry sees nothing. As Spark does, the entries themselves are
also deleted: every write of a TTL state adds an entry to the operator's
index by expiry (one internal state, on the key's partition)::

    expiry + len(state) + state + len(key) + key + user key  ->  b""

(``expiry``: 8 bytes, big-endian, offset as the timers' times; lengths: 2
bytes.) After its input and timers, each task scans the index of its
partitions up to the batch's processing time (a scan that costs what
expired), reads the entries it names, deletes those still expired (a list:
its expired elements; a value rewritten since with a later expiry stays) and
the index entries. The deletions are writes of the batch: staged with the
micro-batch, so a re-run replaces them and they apply exactly once.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

from ..ops import DELETE_MANY, PUT_MANY
from .timers import scan_before, time_key

_LEN = struct.Struct(">H")


def entry(expiry: int, state: str, key: bytes, user_key: bytes = b"") -> bytes:
    name = state.encode()
    return time_key(expiry) + _LEN.pack(len(name)) + name + _LEN.pack(len(key)) + key + user_key


def parse(data: bytes) -> tuple[str, bytes, bytes]:
    """(state, key, user key) of an index entry."""
    n = _LEN.unpack_from(data, 8)[0]
    state, at = data[10:10 + n].decode(), 10 + n
    k = _LEN.unpack_from(data, at)[0]
    return state, data[at + 2:at + 2 + k], data[at + 2 + k:]


def add_entries(writer, index: str, expiry: int, state: str, keys: Sequence[bytes], pids: Sequence[int],
                user_keys: Sequence[bytes] | None = None) -> None:
    """Index entries for the values ``state`` writes in this batch, all expiring at ``expiry``."""
    by_pid: dict[int, list[bytes]] = {}
    for i, (key, pid) in enumerate(zip(keys, pids)):
        by_pid.setdefault(int(pid), []).append(entry(expiry, state, key, b"" if user_keys is None else user_keys[i]))
    for pid, entries in by_pid.items():
        writer.add(pid, (PUT_MANY, index, entries, [b""] * len(entries)))


def clean(handle, batch, pids: Sequence[int], now: int) -> int:
    """Delete what expired at ``now`` on ``pids``, with the batch; returns how many entries were deleted."""
    index = handle.ttl_index
    found: dict[str, list[tuple[bytes, bytes, int]]] = {}
    seen: dict[int, list[bytes]] = {}
    for pid, (entries, _) in scan_before(handle.backend, index, pids, b"", time_key(now + 1)).items():
        for data in entries:
            state, key, user_key = parse(data)
            found.setdefault(state, []).append((key, user_key, pid))
        if entries:
            seen[pid] = entries
    deleted = 0
    for state, items in found.items():
        owner = handle.ttl_handles().get(state)
        if owner is None:  # not asked for by this run's init: left as it is, never read as live
            continue
        deleted += _delete_expired(owner, batch.view(state, owner.kind), items)
    for pid, entries in seen.items():
        batch.writer.add(pid, (DELETE_MANY, index, entries, None))
    return deleted


def _delete_expired(owner, view, items: list[tuple[bytes, bytes, int]]) -> int:
    codec = owner.codec
    keys = [k for k, _, _ in items]
    pids = np.array([p for _, _, p in items], dtype=np.int64)
    if owner.kind == "map":
        user_keys = [uk for _, uk, _ in items]
        stored = view.read(keys, pids, user_keys)
        gone = [i for i, data in enumerate(stored) if data is not None and codec.decode(data) is None]
        view.write([keys[i] for i in gone], [int(pids[i]) for i in gone], [user_keys[i] for i in gone], [None] * len(gone))
        return len(gone)
    stored = view.read(keys, pids)
    if owner.kind == "list":
        live = [codec.live_list(data) if data else data for data in stored]
        gone = [i for i, (data, kept) in enumerate(zip(stored, live)) if data and kept != data]
        view.write([keys[i] for i in gone], [int(pids[i]) for i in gone], [live[i] or None for i in gone])
        return len(gone)
    gone = [i for i, data in enumerate(stored) if data is not None and codec.decode(data) is None]
    view.write([keys[i] for i in gone], [int(pids[i]) for i in gone], [None] * len(gone))
    return len(gone)
