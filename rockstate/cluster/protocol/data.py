"""Messages a node serves to clients: data, and staged micro-batch transactions."""

from __future__ import annotations

from .base import MAX_SCAN_LIMIT, U32, U64, Message, Ranged

# -- served by a node: data ----------------------------------------------------


class Write(Message):
    """Apply ops to several partitions of one owner: ``groups`` is [[pid, ops], ...]; each group is atomic,
    and applied once per ``request`` id (16 bytes; None: every time it is sent)."""

    op = "write"
    epoch: int
    groups: list
    request: bytes | None = None


class Read(Message):
    """Read keys of one state from several partitions: ``groups`` is [[pid, keys], ...]; answers [[values], ...]."""

    op = "read"
    epoch: int
    state: str
    groups: list


class CompareAndSet(Message):
    """Per group ``[pid, [state, key, expected, new]]``: store ``new`` if the key's value is ``expected``
    (None: absent), atomically on the owner; answers [applied?, ...]. With a ``request`` id, a retry is
    answered with the first attempt's outcome; without one it is not safe to retry once sent."""

    op = "compare_and_set"
    epoch: int
    groups: list
    request: bytes | None = None


class Scan(Ranged, Message):
    """A page of live entries of a partition with a key prefix, after a key: [[key, value], ...]."""

    op = "scan"
    ranges = {"limit": (1, MAX_SCAN_LIMIT)}
    epoch: int
    partition: int
    state: str
    prefix: bytes = b""
    after: bytes | None = None
    limit: int = 1000


# -- served by a node: staged micro-batch transactions (see store/staging.py) -------


class Stage(Ranged, Message):
    """Stage a task attempt's writes: ``groups`` is [[pid, ops], ...]; safe to retry."""

    op = "stage"
    ranges = {"batch": (0, U64), "task": (0, U32), "attempt": (0, U32), "seq": (0, U32)}
    epoch: int
    query: str
    batch: int
    task: int
    attempt: int
    seq: int
    groups: list


class StageDone(Ranged, Message):
    """Every flush of the attempt was acknowledged on these partitions (``groups``: [[pid, None], ...])."""

    op = "stage_done"
    ranges = {"batch": (0, U64), "task": (0, U32), "attempt": (0, U32)}
    epoch: int
    query: str
    batch: int
    task: int
    attempt: int
    groups: list


class CommitBatch(Ranged, Message):
    """Apply the stage of (query, batch) on these partitions; idempotent. Answers [applied?, ...]."""

    op = "commit_batch"
    ranges = {"batch": (0, U64)}
    epoch: int
    query: str
    batch: int
    groups: list


class RollbackBatches(Ranged, Message):
    """Undo the query's batches after ``to_batch`` (None: every kept one). Answers [undone count, ...]."""

    op = "rollback_batches"
    ranges = {"to_batch": (0, U64 - 1)}
    epoch: int
    query: str
    to_batch: int | None
    groups: list


class CommittedBatch(Message):
    """The query's last committed batch on each partition (None: never). Answers [batch, ...]."""

    op = "committed_batch"
    epoch: int
    query: str
    groups: list
