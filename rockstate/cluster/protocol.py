"""The cluster's operations: one message class per operation, by role.

Data operations name the client's table ``epoch``: a node refuses (NOT_OWNER)
a request for a partition it does not own, or whose epoch is older than the
epoch at which the node became the partition's owner (fencing clients that
still route by a table from before a move). Reads and scans are safe to
retry; a ``Write`` is idempotent for PUT/DELETE ops and not for APPEND.
"""

from __future__ import annotations

from ..rpc.messages import Message

# -- served by a node: data ----------------------------------------------------


class Write(Message):
    """Apply ops to several partitions of one owner: ``groups`` is [[pid, ops], ...]; each group is atomic."""

    op = "write"
    epoch: int
    groups: list


class Read(Message):
    """Read keys of one state from several partitions: ``groups`` is [[pid, keys], ...]; answers [[values], ...]."""

    op = "read"
    epoch: int
    state: str
    groups: list


class CompareAndSet(Message):
    """Per group ``[pid, [state, key, expected, new]]``: store ``new`` if the key's value is ``expected``
    (None: absent), atomically on the owner; answers [applied?, ...]. Not safe to retry once sent."""

    op = "compare_and_set"
    epoch: int
    groups: list


class Scan(Message):
    """A page of live entries of a partition with a key prefix, after a key: [[key, value], ...]."""

    op = "scan"
    epoch: int
    partition: int
    state: str
    prefix: bytes = b""
    after: bytes | None = None
    limit: int = 1000


# -- served by a node: staged micro-batch transactions (see store/staging.py) -------


class Stage(Message):
    """Stage a task attempt's writes: ``groups`` is [[pid, ops], ...]; safe to retry."""

    op = "stage"
    epoch: int
    query: str
    batch: int
    task: int
    attempt: int
    seq: int
    groups: list


class StageDone(Message):
    """Every flush of the attempt was acknowledged on these partitions (``groups``: [[pid, None], ...])."""

    op = "stage_done"
    epoch: int
    query: str
    batch: int
    task: int
    attempt: int
    groups: list


class CommitBatch(Message):
    """Apply the stage of (query, batch) on these partitions; idempotent. Answers [applied?, ...]."""

    op = "commit_batch"
    epoch: int
    query: str
    batch: int
    groups: list


class RollbackBatches(Message):
    """Undo the query's batches after ``to_batch`` (None: every kept one). Answers [undone count, ...]."""

    op = "rollback_batches"
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


class SnapshotPartitions(Message):
    """Barrier of checkpoint ``checkpoint``: snapshot and upload these partitions; answers their manifests."""

    op = "snapshot_partitions"
    checkpoint: int
    retained: list
    partitions: list


class FinishCheckpoint(Message):
    """Checkpoint ``checkpoint`` completed (its files may be referenced from now on) or was aborted."""

    op = "finish_checkpoint"
    checkpoint: int
    completed: bool
    partitions: list


class RestorePartitions(Message):
    """Replace these partitions with their copy in a checkpoint (``base``: a savepoint's folder)."""

    op = "restore_partitions"
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


class MoveChunk(Message):
    op = "move_chunk"
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


class RestoreCluster(Message):
    """Roll every partition back to a checkpoint (the latest: None) or a savepoint."""

    op = "restore_cluster"
    checkpoint: int | None = None
    savepoint: str | None = None


class CreateSavepoint(Message):
    op = "create_savepoint"
    name: str
    checkpoint: int | None = None


class InspectCheckpoint(Message):
    """A completed checkpoint's _metadata: partitions, sizes, states."""

    op = "inspect_checkpoint"
    checkpoint: int


class ListSavepoints(Message):
    op = "list_savepoints"


class PipelineProgress(Message):
    """A pipeline's bookkeeping after a committed micro-batch (query, last batch, checkpoint, rows, durations)."""

    op = "pipeline_progress"
    record: dict


class Events(Message):
    """Cluster events with a sequence number above ``after``, waiting up to ``wait`` seconds for one."""

    op = "events"
    after: int = 0
    wait: float = 0.0


class Status(Message):
    """Nodes, partitions per node, epoch, recent events."""

    op = "status"


# -- served by a node: bulk ingestion of SST files (see cluster/ingest.py) -----------


class IngestChunk(Message):
    """Bytes of an SST file being uploaded for ``IngestSst``, written at ``offset``; answers the end offset. Safe to retry."""

    op = "ingest_chunk"
    upload: str
    offset: int
    data: bytes


class IngestSst(Message):
    """Ingest upload ``upload`` (``size`` bytes, ``checksum``) into ``state`` of a partition; answers its size.

    The upload is removed whatever the outcome; a retry uploads again.
    """

    op = "ingest_sst"
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
