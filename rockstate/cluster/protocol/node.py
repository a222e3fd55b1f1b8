"""Messages a node serves to the coordinator and to other nodes: the table, checkpoints, moves, bulk ingestion."""

from __future__ import annotations

from ...errors import ProtocolError
from ...names import check_base
from ...ops import APPEND, DELETE, DELETE_MANY, DELETE_RANGE, PUT, PUT_MANY, RAW_PUT, RAW_PUT_MANY
from .base import I64, U32, Message, Ranged

MAX_REPLICA_ITEMS = 10_000  # batches in one ReplicaApply (a primary sends at most 2,000; its frame is bounded too)
_KEYS, _VALUES = (bytes, list, tuple), (bytes, list, tuple, type(None))  # a key or a list; a value, a list or none (a delete)
_MANY = frozenset((PUT_MANY, RAW_PUT_MANY, DELETE_MANY))
STORED_CODES = frozenset((PUT, DELETE, APPEND, PUT_MANY, DELETE_MANY, RAW_PUT, DELETE_RANGE, RAW_PUT_MANY))

# -- served by a node: asked by the coordinator -----------------------------------


class NodeStats(Message):
    """Entries and bytes per state and per owned partition."""

    op = "node_stats"


class NodeFigures(Message):
    """Memory, disk and RocksDB figures (see cluster/metrics.py), for the status page."""

    op = "node_figures"


class NodeIdentity(Message):
    """The node's id (None before it registered): the coordinator asks before letting another address take it."""

    op = "node_identity"


class NodeCount(Ranged, Message):
    """Live entries of a state across the node's partitions."""

    op = "node_count"
    names = {"state": "state name"}
    state: str


class NodeDefineState(Message):
    op = "node_define_state"
    spec: dict


class ApplyTable(Message):
    """The current table: the node opens partitions it now owns and drops those it no longer does. Either the whole
    ``table`` or, to a node holding the one before, its ``delta`` (``Table.delta_from``); answers the node's epoch
    after it (a delta on another base leaves it where it was: the whole table follows)."""

    op = "apply_table"
    table: dict | None = None
    delta: dict | None = None

    def to_wire(self) -> dict:  # a node of an earlier version knows no delta field: the whole table goes without it
        wire = super().to_wire()
        for name in ("table", "delta"):
            if wire[name] is None:
                del wire[name]
        return wire

    def received(self) -> None:
        if (self.table is None) == (self.delta is None):
            raise ProtocolError("apply_table carries a table or a delta")


class SetCheckpoints(Message):
    """The cluster's checkpoint storage (a ``CheckpointConfig``; None: none), from a coordinator that took the lead
    with a storage the node may not know: it registered before the storage was set or changed."""

    op = "set_checkpoints"
    checkpoints: dict | None


class SnapshotPartitions(Ranged, Message):
    """Barrier of checkpoint ``checkpoint``: snapshot and upload these partitions; answers their manifests."""

    op = "snapshot_partitions"
    ranges = {"checkpoint": (0, I64)}
    checkpoint: int
    retained: list
    partitions: list


class FinishCheckpoint(Ranged, Message):
    """Checkpoint ``checkpoint`` completed (its files may be referenced from now on) or was aborted."""

    op = "finish_checkpoint"
    ranges = {"checkpoint": (0, I64)}
    checkpoint: int
    completed: bool
    partitions: list


class RestorePartitions(Ranged, Message):
    """Replace these partitions with their copy in a checkpoint (``base``: a savepoint's folder)."""

    op = "restore_partitions"
    ranges = {"checkpoint": (0, I64)}
    checkpoint: int
    partitions: list
    base: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_base(self.base)  # the cluster's folder or a savepoint's: never elsewhere in (or outside) the storage


class Freeze(Message):
    """Stop writes to a partition that is about to move (reads go on); ``frozen=False`` lifts it."""

    op = "freeze"
    partition: int
    frozen: bool = True


class Drain(Message):
    """A replicated partition handed to a backup: freeze its writes (and sweeps); answers its last batch once
    every in-sync backup applied it. ``Freeze(frozen=False)`` lifts it."""

    op = "drain"
    partition: int


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
    """On the source: take a copy to hand over and record writes from now on; answers [[file, size], ...], then
    streams the files' bytes (``rpc.server.Stream``)."""

    op = "move_copy"
    partition: int


class MoveDelta(Message):
    """On the source: the writes since the copy or the last delta; ``final`` (frozen): recording ends."""

    op = "move_delta"
    partition: int
    final: bool = True


class MoveDiscard(Message):
    """A move failed: the source drops the copy and stops recording."""

    op = "move_discard"
    partition: int


# -- served by a node: replication (see cluster/replication.py) ---------------------------


class ReplicaApply(Message):
    """From a primary node, to one backup node: batches of many partitions in one message, each partition's in its
    order. ``items`` is [[pid, replica epoch, seq, stored ops or None (a probe)], ...], at most MAX_REPLICA_ITEMS;
    ``runs`` carries batch puts' pieces more compactly, applied after the items, in order: each is [state, request
    id or None, pids, replica epochs, seqs, key counts, keys, values], one piece per partition, the piece of
    partition ``pids[i]`` being batch ``seqs[i]``, which stored ``counts[i]`` of the keys and values (in order) with
    RAW_PUT_MANY, and the request id with RAW_PUT (what ``items`` would say of it). Answers [[pid, last applied seq,
    status], ...], one per partition (status: ``ok``, ``stale`` epoch, ``behind``: a gap, ``not_ready``: no copy
    yet). Checked whole before any batch applies: each item's and run's shape, its numbers' ranges, a partition's
    sequence numbers rising through the message, and each stored op's shape (the items of a key or value list are
    checked as they are applied)."""

    op = "replica_apply"
    items: list
    runs: list | None = None  # None: a node of an earlier version knows no runs (the field is left out)

    def to_wire(self) -> dict:
        wire = super().to_wire()
        if wire["runs"] is None:
            del wire["runs"]
        return wire

    def received(self) -> None:  # not on the sender, which builds it from its own logs (checking them was 4 % of its CPU)
        batches = len(self.items) + sum(len(run[2]) for run in self.runs or () if type(run) is list and len(run) == 8
                                        and type(run[2]) is list)
        if batches > MAX_REPLICA_ITEMS:
            raise ProtocolError(f"a 'replica_apply' message carries at most {MAX_REPLICA_ITEMS} batches, not {batches}",
                                op=self.op, field="items")
        last: dict[int, int] = {}
        for item in self.items:
            if type(item) is not list or len(item) != 4 or type(item[0]) is not int or type(item[1]) is not int \
                    or type(item[2]) is not int or not 0 <= item[0] <= U32 or not 0 <= item[1] <= I64 \
                    or not 0 <= item[2] <= I64 or (item[3] is not None and type(item[3]) is not list):
                raise ProtocolError(f"a 'replica_apply' item is [partition, replica epoch, seq, stored ops or None], "
                                    f"not {item!r:.100}", op=self.op, field="items")
            pid, seq, stored = item[0], item[2], item[3]
            if stored is not None:
                if seq <= last.get(pid, 0):
                    raise ProtocolError(f"partition {pid}'s batch {seq} follows its batch {last[pid]} in a 'replica_apply' "
                                        "message: a partition's batches come in order", op=self.op, field="items")
                last[pid] = seq
                for op in stored:
                    if type(op) not in (list, tuple) or len(op) != 4 or type(op[0]) is not int or op[0] not in STORED_CODES \
                            or type(op[1]) is not str or type(op[2]) not in _KEYS or type(op[3]) not in _VALUES:
                        raise ProtocolError(f"a stored op of partition {pid}'s batch {seq} is [code, state, key, value], "
                                            f"not {op!r:.100}", op=self.op, field="items")
                    if op[0] in _MANY and (type(op[2]) is bytes or (op[0] != DELETE_MANY and (
                            type(op[3]) not in (list, tuple) or len(op[3]) != len(op[2])))):  # else a put's keys and values pair off wrong
                        raise ProtocolError(f"a stored op of partition {pid}'s batch {seq} puts or deletes many keys: a "
                                            "list of keys (and of as many values)", op=self.op, field="items")
        for run in self.runs or ():
            _check_run(run, last)


def _check_run(run: object, last: dict[int, int]) -> None:
    """One of ``ReplicaApply.runs``; ``last``: each partition's last batch before it in the message."""
    if type(run) is not list or len(run) != 8 or type(run[0]) is not str or (run[1] is not None and type(run[1]) is not bytes) \
            or any(type(column) is not list for column in run[2:]):
        raise ProtocolError(f"a 'replica_apply' run is [state, request id or None, pids, epochs, seqs, counts, keys, values], "
                            f"not {run!r:.100}", op="replica_apply", field="runs")
    _, _, pids, epochs, seqs, counts, keys, values = run
    if not len(pids) == len(epochs) == len(seqs) == len(counts) or len(keys) != len(values):
        raise ProtocolError("a 'replica_apply' run has a pid, an epoch, a seq and a count per piece, and a value per key",
                            op="replica_apply", field="runs")
    total = 0
    for pid, epoch, seq, count in zip(pids, epochs, seqs, counts):
        if type(pid) is not int or type(epoch) is not int or type(seq) is not int or type(count) is not int \
                or not 0 <= pid <= U32 or not 0 <= epoch <= I64 or not 0 < seq <= I64 or count < 0:
            raise ProtocolError(f"a 'replica_apply' run's piece is partition, replica epoch, seq and key count in range, "
                                f"not {[pid, epoch, seq, count]!r:.100}", op="replica_apply", field="runs")
        if seq <= last.get(pid, 0):
            raise ProtocolError(f"partition {pid}'s batch {seq} follows its batch {last[pid]} in a 'replica_apply' message: "
                                "a partition's batches come in order", op="replica_apply", field="runs")
        last[pid] = seq
        total += count
    if total != len(keys):
        raise ProtocolError(f"a 'replica_apply' run's pieces count {total} keys, and it carries {len(keys)}",
                            op="replica_apply", field="runs")


class ReplicaCopy(Ranged, Message):
    """On a primary: take a copy of each of ``partitions`` it serves with backup ``node``, and ship the backup
    the batches after each; answers {"parts": [[pid, [[name, size], ...]], ...]} (a never-written partition: no
    files), then streams every part's files' bytes in that order."""

    op = "replica_copy"
    names = {"node": "node id"}
    partitions: list
    node: str
    epochs: list | None = None  # each partition's replica epoch the backup was told to copy at (None: a node before them)


class ReplicaCopyGroup(ReplicaCopy):
    """``ReplicaCopy``, the copies as one export (a file per state for all of them): answers {"parts": [[pid, []],
    ...], "files": [[name, size], ...]}, then streams the files' bytes in that order. Its own operation, so a
    primary of an earlier version refuses it (the backup then asks a ``ReplicaCopy``), and a backup of an earlier
    version, which asks a ``ReplicaCopy``, never gets a group it would take for empty copies."""

    op = "replica_copy_group"


class ReplicaInline(ReplicaCopy):
    """``ReplicaCopy`` in the answer itself, for small partitions: of ``partitions``, each whose keys and values weigh
    at most ``INLINE_BYTES`` (a new cluster's weigh nothing) is cut under its write lock as a copy is, its batches
    after the cut shipped to the backup, and answered as [[pid, {state: [keys, values]}], ...] (keys without the
    partition's prefix), up to ``INLINE_ANSWER`` bytes in all; the backup writes them in one batch and copies the
    others in files (``ReplicaCopyGroup``). A copy in files costs a connection, an export, a stream and an
    ingestion whatever its size: a new cluster of 16 nodes took 240 such transfers of empty copies, and a leave at
    P=1024 one per partition. Its own operation, so a primary of an earlier version refuses it, and the backup
    copies them all in files."""

    op = "replica_inline"


class ReplicaCatchUp(Message):
    """From the coordinator, to a new or returning backup: copy ``partitions`` ([[pid, replica epoch], ...]) from
    their primary at ``source``, in one transfer; their primary then ships it the batches after each copy and reports
    it caught up. Answers {pid: bytes copied} for the partitions copied."""

    op = "replica_catch_up"
    partitions: list
    source: str


class ReplicaPositions(Message):
    """From the coordinator, to a dead primary's backups: each partition's last applied batch; answers {pid: seq}."""

    op = "replica_positions"
    partitions: list
    epoch: int = 0


# -- served by a node: bulk ingestion of SST files (see cluster/ingest.py) -----------


class IngestChunk(Ranged, Message):
    """Bytes of an SST file being uploaded for ``IngestSst``, written at ``offset``; answers the end offset. Safe to retry."""

    op = "ingest_chunk"
    ranges = {"offset": (0, I64)}
    names = {"upload": "upload id"}
    upload: str
    offset: int
    data: bytes


class IngestSst(Ranged, Message):
    """Ingest upload ``upload`` (``size`` bytes, ``checksum``) into ``state`` of a partition; answers its size.

    The upload is removed whatever the outcome; a retry uploads again.
    """

    op = "ingest_sst"
    ranges = {"size": (0, I64)}
    names = {"upload": "upload id", "state": "state name"}
    epoch: int
    partition: int
    state: str
    upload: str
    size: int
    checksum: str


class IngestAbort(Ranged, Message):
    """Drop an upload that will not be ingested."""

    op = "ingest_abort"
    names = {"upload": "upload id"}
    upload: str
