"""The cluster's operations: one message class per operation, by role.

Data operations name the client's table ``epoch``: a node refuses (NOT_OWNER)
a request for a partition it does not own, or whose epoch is older than the
epoch at which the node became the partition's owner (fencing clients that
still route by a table from before a move). Reads and scans are safe to
retry; a ``Write`` or ``CompareAndSet`` carrying a ``request`` id is applied
once however often it is sent (see ``store/requests.py``).

Numeric fields with a range (a scan's limit, batch and task numbers,
checkpoint ids, offsets, waits) name it in ``ranges``; a message out of range
is refused with a ``ProtocolError`` that names the field and what is allowed,
when it is made and when it is decoded.
"""

from __future__ import annotations

import math
from typing import ClassVar

from ..errors import ProtocolError
from ..rpc.frames import MAX_FRAME
from ..rpc.messages import Message

U32, U64, I64 = (1 << 32) - 1, (1 << 64) - 1, (1 << 63) - 1  # what staging's and storage's struct formats hold
MAX_SCAN_LIMIT = 100_000  # entries in one scan page (the client asks for 1000)


class _Ranged:
    """A message whose numeric fields must lie in ``ranges``: {field: (lowest, highest or None)}.

    None (where the field allows it) is not checked, nor a value of the wrong
    type (``Message.from_wire`` names that); a float must also be finite.
    """

    ranges: ClassVar[dict[str, tuple[float, float | None]]] = {}

    def __post_init__(self) -> None:
        for name, (low, high) in self.ranges.items():
            value = getattr(self, name)
            if type(value) not in (int, float):
                continue
            if low <= value and (high is None or value <= high) and (type(value) is int or math.isfinite(value)):
                continue
            kind = "a finite number" if float in (self._types[name] or (float,)) else "an int"
            allowed = f"{kind} from {low} to {_show(high)}" if high is not None else f"{kind} >= {low}"
            if type(None) in (self._types[name] or ()):
                allowed = f"None or {allowed}"
            raise ProtocolError(f"field {name!r} of {self.op!r} message must be {allowed}, not {value!r}", op=self.op, field=name)


def _show(n: float) -> str:
    """A bound as people read it: 2**64 - 1 rather than 18446744073709551615."""
    p = int(n).bit_length()
    if type(n) is int and n >= 1 << 20:
        if n == 1 << (p - 1):
            return f"2**{p - 1}"
        if (1 << p) - n < 16:
            return f"2**{p} - {(1 << p) - n}"
    return str(n)


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


class Scan(_Ranged, Message):
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


class Stage(_Ranged, Message):
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


class StageDone(_Ranged, Message):
    """Every flush of the attempt was acknowledged on these partitions (``groups``: [[pid, None], ...])."""

    op = "stage_done"
    ranges = {"batch": (0, U64), "task": (0, U32), "attempt": (0, U32)}
    epoch: int
    query: str
    batch: int
    task: int
    attempt: int
    groups: list


class CommitBatch(_Ranged, Message):
    """Apply the stage of (query, batch) on these partitions; idempotent. Answers [applied?, ...]."""

    op = "commit_batch"
    ranges = {"batch": (0, U64)}
    epoch: int
    query: str
    batch: int
    groups: list


class RollbackBatches(_Ranged, Message):
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


# -- served by a node: asked by the coordinator -----------------------------------


class NodeStats(Message):
    """Entries and bytes per state and per owned partition."""

    op = "node_stats"


class NodeCount(Message):
    """Live entries of a state across the node's partitions."""

    op = "node_count"
    state: str


class NodeDefineState(Message):
    op = "node_define_state"
    spec: dict


class ApplyTable(Message):
    """The current table: the node opens partitions it now owns and drops those it no longer does."""

    op = "apply_table"
    table: dict


class SnapshotPartitions(_Ranged, Message):
    """Barrier of checkpoint ``checkpoint``: snapshot and upload these partitions; answers their manifests."""

    op = "snapshot_partitions"
    ranges = {"checkpoint": (0, I64)}
    checkpoint: int
    retained: list
    partitions: list


class FinishCheckpoint(_Ranged, Message):
    """Checkpoint ``checkpoint`` completed (its files may be referenced from now on) or was aborted."""

    op = "finish_checkpoint"
    ranges = {"checkpoint": (0, I64)}
    checkpoint: int
    completed: bool
    partitions: list


class RestorePartitions(_Ranged, Message):
    """Replace these partitions with their copy in a checkpoint (``base``: a savepoint's folder)."""

    op = "restore_partitions"
    ranges = {"checkpoint": (0, I64)}
    checkpoint: int
    partitions: list
    base: str = ""


class Freeze(Message):
    """Stop writes to a partition that is about to move (reads go on); ``frozen=False`` lifts it."""

    op = "freeze"
    partition: int
    frozen: bool = True


class Release(Message):
    """The partition is about to get a new owner: stop serving it now (requests get NOT_OWNER meanwhile)."""

    op = "release"
    partition: int


class Thaw(Message):
    """From a restarted coordinator: no move is in flight any more; unfreeze everything, drop move copies."""

    op = "thaw"


class Pull(Message):
    """Move phase 1, on the target: fetch a copy of the partition from its owner at ``source``; answers bytes."""

    op = "pull"
    partition: int
    source: str


class PullDelta(Message):
    """Move phase 2, on the target (the source is frozen): install the copy, apply the writes made since."""

    op = "pull_delta"
    partition: int
    source: str


class PullDiscard(Message):
    """A move failed: the target drops what it fetched."""

    op = "pull_discard"
    partition: int


class MoveCopy(Message):
    """On the source: take a copy to hand over and record writes from now on; answers [[file, size], ...]."""

    op = "move_copy"
    partition: int


class MoveChunk(_Ranged, Message):
    op = "move_chunk"
    ranges = {"offset": (0, I64), "length": (1, MAX_FRAME)}
    partition: int
    name: str
    offset: int
    length: int


class MoveDelta(Message):
    """On the source: the writes since the copy or the last delta; ``final`` (frozen): recording ends."""

    op = "move_delta"
    partition: int
    final: bool = True


class MoveDiscard(Message):
    """A move failed: the source drops the copy and stops recording."""

    op = "move_discard"
    partition: int


# -- served by the coordinator ---------------------------------------------------


class Register(Message):
    """A node joins (or rejoins with its id); answers node_id, table, states."""

    op = "register"
    address: str
    node_id: str | None = None


class Heartbeat(Message):
    """A node is alive; answers the current table epoch, so the node knows when to fetch it."""

    op = "heartbeat"
    node_id: str
    epoch: int


class Leave(Message):
    """A node leaves gracefully: its partitions move away first; answers when they have."""

    op = "leave"
    node_id: str


class GetTable(Message):
    op = "get_table"


class DefineState(Message):
    op = "define_state"
    spec: dict


class ClusterStats(Message):
    op = "cluster_stats"


class Count(Message):
    op = "count"
    state: str


class TriggerCheckpoint(Message):
    """Take a checkpoint now and wait for it; answers its record."""

    op = "trigger_checkpoint"


class ListCheckpoints(Message):
    op = "list_checkpoints"


class RestoreCluster(_Ranged, Message):
    """Roll every partition back to a checkpoint (the latest: None) or a savepoint."""

    op = "restore_cluster"
    ranges = {"checkpoint": (0, I64)}
    checkpoint: int | None = None
    savepoint: str | None = None


class CreateSavepoint(_Ranged, Message):
    op = "create_savepoint"
    ranges = {"checkpoint": (0, I64)}
    name: str
    checkpoint: int | None = None


class InspectCheckpoint(_Ranged, Message):
    """A completed checkpoint's _metadata: partitions, sizes, states."""

    op = "inspect_checkpoint"
    ranges = {"checkpoint": (0, I64)}
    checkpoint: int


class ListSavepoints(Message):
    op = "list_savepoints"


class PipelineProgress(Message):
    """A pipeline's bookkeeping after a committed micro-batch (query, last batch, checkpoint, rows, durations)."""

    op = "pipeline_progress"
    record: dict


class Events(_Ranged, Message):
    """Cluster events with a sequence number above ``after``, waiting up to ``wait`` seconds for one."""

    op = "events"
    ranges = {"after": (0, None), "wait": (0, None)}
    after: int = 0
    wait: float = 0.0


class Status(Message):
    """Nodes, partitions per node, epoch, recent events."""

    op = "status"


# -- served by a node: bulk ingestion of SST files (see cluster/ingest.py) -----------


class IngestChunk(_Ranged, Message):
    """Bytes of an SST file being uploaded for ``IngestSst``, written at ``offset``; answers the end offset. Safe to retry."""

    op = "ingest_chunk"
    ranges = {"offset": (0, I64)}
    upload: str
    offset: int
    data: bytes


class IngestSst(_Ranged, Message):
    """Ingest upload ``upload`` (``size`` bytes, ``checksum``) into ``state`` of a partition; answers its size.

    The upload is removed whatever the outcome; a retry uploads again.
    """

    op = "ingest_sst"
    ranges = {"size": (0, I64)}
    epoch: int
    partition: int
    state: str
    upload: str
    size: int
    checksum: str


class IngestAbort(Message):
    """Drop an upload that will not be ingested."""

    op = "ingest_abort"
    upload: str
