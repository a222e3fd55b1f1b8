"""Messages a node serves to clients: data, and staged micro-batch transactions."""

from __future__ import annotations

from ...errors import ProtocolError
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
    """Read keys of one state from several partitions, as columns: ``keys`` in runs, run i ``counts[i]`` keys of
    partition ``pids[i]``; answers their values (None: absent) in one list, in the keys' order. Columns, not a list
    per partition: a 5,000-key read at P=1024 reaches ~340 partitions of a node, each a list both ways before."""

    op = "read"
    epoch: int
    state: str
    pids: list
    counts: list
    keys: list
    backup: bool = False  # served by a backup (``read_from_backup``): may miss the latest writes

    def received(self) -> None:
        _check_runs(self)


class WriteRuns(Message):
    """Batch puts (``values``, one per key) or deletes (``values`` None) of one state to several partitions of one
    owner, as columns, as ``Read`` reads them: ``keys`` in runs, run i ``counts[i]`` keys of partition ``pids[i]``.
    Each run is what the ``Write`` group ``[pid, [[PUT_MANY or DELETE_MANY, state, keys, values]]]`` is: atomic,
    and applied once per ``request`` id. Columns, not a group per partition: a 5,000-key put at P=1024 reaches ~340
    partitions of a node, each a list of lists the client built and kept for the call (its garbage collector walked
    them: ~30 % of the client's CPU for such a put)."""

    op = "write_runs"
    epoch: int
    state: str
    pids: list
    counts: list
    keys: list
    values: list | None = None
    request: bytes | None = None

    def received(self) -> None:
        _check_runs(self)
        if self.values is not None and len(self.values) != len(self.keys):
            raise ProtocolError(f"a 'write_runs' message has a value per key or none; not {len(self.values)} values for "
                                f"its {len(self.keys)} keys", op=self.op, field="values")


def _check_runs(msg: Read | WriteRuns) -> None:
    """A partition and a count (>= 1) per run of keys, the counts adding up to the keys."""
    if len(msg.pids) != len(msg.counts) or not set(map(type, msg.pids)) <= {int} \
            or not set(map(type, msg.counts)) <= {int} or (msg.counts and min(msg.counts) < 1) \
            or sum(msg.counts) != len(msg.keys):
        raise ProtocolError(f"a {msg.op!r} message has a partition and a count (>= 1) per run of keys, counts adding up "
                            f"to its {len(msg.keys)} keys; not pids {msg.pids!r:.80} and counts {msg.counts!r:.80}",
                            op=msg.op, field="counts")


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


class ScanMany(Message):
    """Pages of several partitions of one owner: ``groups`` is [[pid, [prefix, after, stop, limit]], ...], each a
    ``Scan`` that also stops before the key ``stop`` (None: at the prefix's end); answers a page per group,
    [[key, value], ...], or with ``columns`` as ``page_columns`` packs it (its keys and its values, each as one
    string and its items' lengths: a page of small entries decodes without an object per entry, ~3x faster;
    an optional field, so a client of before it still gets pairs)."""

    op = "scan_many"
    epoch: int
    state: str
    groups: list
    columns: bool = False


def page_columns(keys: list[bytes], values: list[bytes]) -> list[bytes]:
    """A page as ``ScanMany`` answers it: [keys laid end to end, their lengths, values likewise, their lengths]."""
    return [b"".join(keys), _lengths(keys), b"".join(values), _lengths(values)]


def page_of(columns: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    """(keys, values) of a ``page_columns`` answer."""
    keys, key_lengths, values, value_lengths = columns
    return _split(keys, key_lengths), _split(values, value_lengths)


def _lengths(items: list[bytes]) -> bytes:
    import numpy as np  # here: a scan's page needs it, a node's start need not pay its import (~0.1 s a process)
    return np.fromiter(map(len, items), "<u4", len(items)).tobytes()


def _split(data: bytes, lengths: bytes) -> list[bytes]:
    import numpy as np
    ends = np.cumsum(np.frombuffer(lengths, "<u4"), dtype=np.int64).tolist()
    if (ends[-1] if ends else 0) != len(data):
        raise ProtocolError(f"a scan page's lengths add up to {ends[-1] if ends else 0} bytes, not its {len(data)}")
    return [data[start:end] for start, end in zip([0] + ends, ends)]


# -- served by a node: staged micro-batch transactions (see store/staging.py) -------


class Stage(Ranged, Message):
    """Stage a task attempt's writes of a micro-batch: ``groups`` is [[pid, ops], ...]; safe to retry."""

    op = "stage"
    ranges = {"batch": (0, U64), "attempt": (0, U64), "seq": (0, U32)}
    epoch: int
    query: str
    batch: int
    operator: str
    attempt: int
    seq: int
    groups: list


class StageDone(Ranged, Message):
    """Every piece of the attempt is staged: ``groups`` is [[pid, pieces sent to it], ...]."""

    op = "stage_done"
    ranges = {"batch": (0, U64), "attempt": (0, U64)}
    epoch: int
    query: str
    batch: int
    operator: str
    attempt: int
    groups: list


class AdvanceBatches(Ranged, Message):
    """Apply the query's staged batches below ``batch`` on these partitions. Answers [applied through, ...]."""

    op = "advance_batches"
    ranges = {"batch": (0, U64)}
    epoch: int
    query: str
    batch: int
    groups: list


class FinishTask(Ranged, Message):
    """A task of a batch's operator ran whole (see store/staging.finish_task). Answers one record per group."""

    op = "finish_task"
    ranges = {"batch": (0, U64), "task": (0, U32), "tasks": (1, U32)}
    epoch: int
    query: str
    batch: int
    operator: str
    run: str
    task: int
    tasks: int
    pids: list
    groups: list
    failed: str | None = None


class Seal(Ranged, Message):
    """The batch's stages are complete on these partitions. Answers [has the operator a done attempt, ...]."""

    op = "seal"
    ranges = {"batch": (0, U64)}
    epoch: int
    query: str
    batch: int
    operator: str
    groups: list
