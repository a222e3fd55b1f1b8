"""Staged writes of a pipeline's micro-batches, committed atomically per partition, with undo.

A transaction is (query, batch). Spark tasks *stage* their writes under
(query, batch, task, attempt, seq) and, once every flush of the attempt is
acknowledged, mark the attempt *done*. *Commit* then applies, per task, the
staged writes of its highest done attempt (a retried or speculative attempt
replaces the earlier one; processors are deterministic, as Spark requires),
records an undo entry with every touched key's value from before the batch,
moves the query's committed-batch marker, and drops the stage — all in one
RocksDB WriteBatch. *Rollback* to batch M replays the undo entries of the
batches after M, newest first, in one WriteBatch. Only the query's own
writes are undone: other queries and states are untouched (a state written by
two queries is rolled back as a whole; don't share states between queries).

Everything lives in the partition's own RocksDB (column families ``_staged``,
``_undo``, ``_meta``), so stages and undo travel with the partition when it
moves or is checkpointed.

Transitions of a transaction on one partition::

    (none) --stage*--> staged --done--> staged+done --commit--> committed
    committed --commit (retry)--> committed          (idempotent)
    committed --rollback(to < batch)--> rolled back  (stage and undo removed)
"""

from __future__ import annotations

import struct
import msgpack

from ..errors import RollbackError
from ..ops import APPEND, DELETE, DELETE_MANY, DELETE_PREFIX, DELETE_RANGE, PUT, PUT_MANY, RAW_PUT
from .partition import Partition, prefix_end

STAGED, UNDO, META = "_staged", "_undo", "_meta"
INTERNAL_STATES = (STAGED, UNDO, META)
KEEP_UNDO = 3  # batches a query can roll back; older undo entries are dropped at commit

_BATCH = struct.Struct(">Q")
_ATTEMPT = struct.Struct(">II")
_SEQ = struct.Struct(">I")


def _query(query: str) -> bytes:
    return msgpack.packb(query)


def _txn(query: str, batch: int) -> bytes:
    return _query(query) + _BATCH.pack(batch)


def _marker(query: str) -> bytes:
    return b"committed:" + _query(query)


def committed(part: Partition, query: str) -> int | None:
    data = part.raw_get(META, [_marker(query)])[0]
    return None if data is None else msgpack.unpackb(data)


def stage(part: Partition, query: str, batch: int, task: int, attempt: int, seq: int, ops: list) -> None:
    key = _txn(query, batch) + b"S" + _ATTEMPT.pack(task, attempt) + _SEQ.pack(seq)
    part.write([(PUT, STAGED, key, msgpack.packb(ops, use_bin_type=True))])


def mark_done(part: Partition, query: str, batch: int, task: int, attempt: int) -> None:
    part.write([(PUT, STAGED, _txn(query, batch) + b"D" + _ATTEMPT.pack(task, attempt), b"")])


def _chosen_ops(part: Partition, prefix: bytes) -> list:
    staged: dict[tuple[int, int], list[tuple[int, bytes]]] = {}
    done: dict[int, int] = {}
    for key, value in part.raw_items(STAGED, prefix, prefix_end(prefix)):
        kind, rest = key[len(prefix):len(prefix) + 1], key[len(prefix) + 1:]
        task, attempt = _ATTEMPT.unpack_from(rest)
        if kind == b"D":
            done[task] = max(done.get(task, -1), attempt)
        else:
            staged.setdefault((task, attempt), []).append((_SEQ.unpack_from(rest, 8)[0], value))
    ops = []
    for task in sorted(done):
        for _, data in sorted(staged.get((task, done[task]), [])):
            ops.extend(msgpack.unpackb(data, raw=False))
    return ops


def _old_values(part: Partition, ops: list) -> list:
    """[state, key, stored value or None] of every key ``ops`` touch, as they are now."""
    touched: dict[tuple[str, bytes], None] = {}
    prefixes = []
    for op, state, key, _ in ops:
        if op in (PUT_MANY, DELETE_MANY):
            touched.update(((state, k), None) for k in key)
        elif op in (PUT, DELETE, APPEND):
            touched[state, key] = None
        elif op == DELETE_PREFIX:
            prefixes.append((state, key))
    undo = []
    by_state: dict[str, list[bytes]] = {}
    for state, key in touched:
        by_state.setdefault(state, []).append(key)
    for state, keys in by_state.items():
        undo.extend([state, k, v] for k, v in zip(keys, part.raw_get(state, keys)))
    for state, prefix in prefixes:
        undo.extend([state, k, v] for k, v in part.raw_items(state, prefix, prefix_end(prefix)) if (state, k) not in touched)
    return undo


def commit(part: Partition, query: str, batch: int) -> bool:
    """Apply the stage of (query, batch); False if it was committed already."""
    with part.lock:
        last = committed(part, query)
        if last is not None and last >= batch:
            return False
        prefix = _txn(query, batch)
        ops = _chosen_ops(part, prefix)
        undo = _old_values(part, ops)
        ops += [
            (PUT, UNDO, prefix, msgpack.packb(undo, use_bin_type=True)),
            (PUT, META, _marker(query), msgpack.packb(batch)),
            (DELETE_PREFIX, STAGED, prefix, None),
        ]
        if batch >= KEEP_UNDO:
            ops.append((DELETE_RANGE, UNDO, _txn(query, 0), _txn(query, batch - KEEP_UNDO + 1)))
        part.write(ops)  # one WriteBatch, through write() so a partition on the move records it
        return True


def rollback(part: Partition, query: str, to_batch: int | None) -> int:
    """Undo the query's batches after ``to_batch`` (None: all kept); returns how many were undone."""
    with part.lock:
        last = committed(part, query)
        floor = -1 if to_batch is None else to_batch
        start = _txn(query, floor + 1)
        end = prefix_end(_query(query))
        entries = list(part.raw_items(UNDO, start, end))
        if last is not None and last > floor:
            kept = {_BATCH.unpack_from(k, len(_query(query)))[0] for k, _ in entries}
            missing = [b for b in range(floor + 1, last + 1) if b not in kept]
            if missing:
                raise RollbackError(
                    f"query {query!r} on partition {part.pid} cannot roll back to batch {to_batch}: "
                    f"undo of batches {missing[:5]} is gone (the last {KEEP_UNDO} batches are kept)"
                )
        ops = []
        for _, data in reversed(entries):  # newest first; older batches' values win
            for state, key, old in msgpack.unpackb(data, raw=False):
                ops.append((DELETE, state, key, None) if old is None else (RAW_PUT, state, key, old))
        ops += [(DELETE_RANGE, UNDO, start, end), (DELETE_RANGE, STAGED, start, end)]
        if to_batch is None:
            ops.append((DELETE, META, _marker(query), None))
        elif last is not None and last > to_batch:
            ops.append((PUT, META, _marker(query), msgpack.packb(to_batch)))
        part.write(ops)
        return len(entries)
