"""A query's state versioned by Spark micro-batch: staged per batch, applied once Spark has committed it.

A Spark task of micro-batch N of query Q *stages* its state writes on every
partition it writes, under (Q, N, operator, attempt, seq), and marks the
attempt *done* there with the number of pieces it sent (the node checks
them all present: a piece lost with a dead node fails the attempt, and
Spark retries the task). A partition's state for Q is *applied through*
batch A (``applied``): every staged batch up to A is in its states.

*Advance to N* applies each staged batch B with A < B < N — per operator ONE
done attempt (the last marked), its pieces in order — drops the stages
below N and records A = N - 1, in one RocksDB WriteBatch. Batch N's tasks
advance the partitions before they read them, and the driver advances to
N + 1 once Spark reports batch N committed.

Why this gives exactly once whatever the sink: Spark starts batch N only
after committing N - 1, and re-runs an uncommitted batch with the same
input. So everything below N is final when N runs, and N reads the state as
batches < N left it; its own stage is never read (a task reads its own
writes from memory). A re-run of N — a retried or speculative task, a
driver restart, a partition restored during the batch — stages N again, and
any one done attempt is N's version: all of a partition's rows of a batch
go to one task (the operator shuffles by partition), so every done attempt
of (partition, operator, batch) holds the same writes (processors are
deterministic, as Spark requires).

Stages live in the partition's RocksDB (column families ``_staged`` and
``_meta``), so they travel with the partition when it moves and are in its
checkpoints.

Transitions of (query, batch) on one partition::

    (none) --stage*--> staged --done(pieces)--> done   (more attempts may stage and be done)
    staged/done --advance(> batch)--> applied          (stages dropped; applied = batch or later)
    applied --stage / done--> refused                  (BatchAppliedError: an attempt of a committed batch)
"""

from __future__ import annotations

import struct
import time

import msgpack

from ..errors import BatchAppliedError, StageIncompleteError, StateRewoundError
from ..ops import DELETE_RANGE, PUT
from .partition import Partition, prefix_end

STAGED, META = "_staged", "_meta"
INTERNAL_STATES = (STAGED, META)

_BATCH = struct.Struct(">Q")
_ATTEMPT = struct.Struct(">Q")
_SEQ = struct.Struct(">I")
PIECE, DONE = b"S", b"D"


def _query(query: str) -> bytes:
    return msgpack.packb(query)


def _batch(query: str, batch: int) -> bytes:
    return _query(query) + _BATCH.pack(batch)


def _attempt(query: str, batch: int, kind: bytes, operator: str, attempt: int) -> bytes:
    return _batch(query, batch) + kind + msgpack.packb(operator) + _ATTEMPT.pack(attempt)


def _marker(query: str) -> bytes:
    return b"applied:" + _query(query)


def applied(part: Partition, query: str) -> int | None:
    """The last batch of ``query`` applied on this partition (None: none yet)."""
    data = part.raw_get(META, [_marker(query)])[0]
    return None if data is None else msgpack.unpackb(data)


def _refuse_applied(part: Partition, query: str, batch: int) -> None:
    last = applied(part, query)
    if last is not None and batch <= last:
        raise BatchAppliedError(
            f"query {query!r} batch {batch} is already applied on partition {part.pid} (through batch {last}): "
            "this is an attempt of a batch Spark has committed",
            query=query, batch=batch, applied=last,
        )


def stage(part: Partition, query: str, batch: int, operator: str, attempt: int, seq: int, ops: list) -> None:
    with part.lock:
        _refuse_applied(part, query, batch)
        key = _attempt(query, batch, PIECE, operator, attempt) + _SEQ.pack(seq)
        part.write([(PUT, STAGED, key, msgpack.packb(ops, use_bin_type=True))])


def mark_done(part: Partition, query: str, batch: int, operator: str, attempt: int, pieces: int) -> None:
    """The attempt is whole on this partition: its ``pieces`` staged pieces are all here."""
    with part.lock:
        _refuse_applied(part, query, batch)
        prefix = _attempt(query, batch, PIECE, operator, attempt)
        have = sum(1 for _ in part.raw_items(STAGED, prefix, prefix_end(prefix)))
        if have != pieces:
            raise StageIncompleteError(
                f"query {query!r} batch {batch}: partition {part.pid} holds {have} of the attempt's {pieces} staged "
                "pieces (the partition was restored or moved during the task); the task must run again",
                partition=part.pid,
            )
        part.write([(PUT, STAGED, _attempt(query, batch, DONE, operator, attempt), msgpack.packb(time.time_ns()))])


def _chosen_ops(part: Partition, query: str, start: bytes, end: bytes) -> list:
    """The ops of every staged batch in [start, end): per (batch, operator), the last done attempt's pieces in order."""
    at = len(_query(query)) + _BATCH.size  # where the kind byte is
    pieces: dict[bytes, list[bytes]] = {}  # piece prefix of an attempt -> its pieces, in seq order
    done: dict[tuple[bytes, bytes], tuple[int, bytes]] = {}  # (batch, operator) -> (when marked, piece prefix)
    for key, value in part.raw_items(STAGED, start, end):
        if key[at:at + 1] == DONE:
            owner, when = (key[:at], key[at + 1:-_ATTEMPT.size]), msgpack.unpackb(value)
            if owner not in done or when > done[owner][0]:
                done[owner] = (when, key[:at] + PIECE + key[at + 1:])
        else:
            pieces.setdefault(key[:-_SEQ.size], []).append(value)
    ops = []
    for owner in sorted(done):  # batches in order; operators in name order within a batch
        for data in pieces.get(done[owner][1], []):
            ops.extend(msgpack.unpackb(data, raw=False))
    return ops


def sealed_key(query: str) -> bytes:
    """The ``META`` key of the query's seal mark (the last batch sealed), read by the driver's listener too."""
    return b"sealed:" + _query(query)


def _tasks_key(query: str, batch: int, operator: str, run: str) -> bytes:
    return b"tasks:" + _batch(query, batch) + msgpack.packb([operator, run])


def finish_task(part: Partition, query: str, batch: int, operator: str, run: str, task: int, tasks: int,
                pids: list, failed: str | None) -> list:
    """Record that ``task`` (of ``tasks``) of the batch's operator ran whole in Spark run ``run``.

    Answers [whether this call completed the set, every partition the tasks
    staged on, why the batch failed or None];
    ``failed`` makes every later call for the batch answer it (the batch must
    run again from the start).
    """
    key = _tasks_key(query, batch, operator, run)
    with part.lock:
        data = part.raw_get(META, [key])[0]
        record = msgpack.unpackb(data) if data else {"tasks": [], "pids": [], "failed": None}
        was_complete = len(record["tasks"]) >= tasks
        record["tasks"] = sorted(set(record["tasks"]) | {task})
        record["pids"] = sorted(set(record["pids"]) | set(pids))
        record["failed"] = record["failed"] or failed
        part.write([(PUT, META, key, msgpack.packb(record))])
        return [not was_complete and len(record["tasks"]) >= tasks, record["pids"], record["failed"]]


def seal(part: Partition, query: str, batch: int, operator: str) -> bool:
    """The batch's stages are complete here (a checkpoint taken next holds them); answers whether the operator has a done attempt."""
    with part.lock:
        last = sealed(part, query)
        if last is None or last < batch:
            part.write([(PUT, META, sealed_key(query), msgpack.packb(batch))])
        prefix = _batch(query, batch) + DONE + msgpack.packb(operator)
        return any(True for _ in part.raw_items(STAGED, prefix, prefix_end(prefix)))


def sealed(part: Partition, query: str) -> int | None:
    data = part.raw_get(META, [sealed_key(query)])[0]
    return None if data is None else msgpack.unpackb(data)


def advance(part: Partition, query: str, batch: int) -> int | None:
    """Apply the staged batches of ``query`` below ``batch``; returns the batch the partition is applied through.

    Idempotent; a caller running ``batch`` gets back a number >= ``batch`` if
    the partition is ahead of it (Spark re-running a batch it committed).
    Refused with ``StateRewoundError`` when the partition does not hold every
    batch below ``batch`` whole (it was restored from a checkpoint older than
    the last batch's seal).
    """
    with part.lock:
        last = applied(part, query)
        if batch == 0 or (last is not None and last >= batch - 1):
            return last
        seal_mark = sealed(part, query)
        if seal_mark is None or seal_mark < batch - 1:
            raise StateRewoundError(
                f"query {query!r}: Spark has committed batch {batch - 1} but partition {part.pid} holds the query's "
                f"state only through batch {seal_mark} (restored from an older checkpoint); restore the cluster to a "
                "checkpoint at or before that batch and restart the query from a Spark checkpoint of it",
                batch=seal_mark, partition=part.pid,
            )
        start, end = _batch(query, 0 if last is None else last + 1), _batch(query, batch)
        ops = _chosen_ops(part, query, start, end)
        ops += [(DELETE_RANGE, STAGED, start, end), (PUT, META, _marker(query), msgpack.packb(batch - 1)),
                (DELETE_RANGE, META, b"tasks:" + start, b"tasks:" + end)]
        part.write(ops)  # one WriteBatch, through write() so a partition on the move records it
        return batch - 1
