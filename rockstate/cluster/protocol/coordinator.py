"""Messages the coordinator serves, to nodes and clients."""

from __future__ import annotations

from .base import I64, Message, Ranged

# -- served by the coordinator ---------------------------------------------------


class Register(Message):
    """A node joins (or rejoins with its id); answers node_id, table, states."""

    op = "register"
    address: str
    node_id: str | None = None
    zone: str | None = None


class ReplicaReport(Message):
    """From a partition's primary: ``reports`` is [[pid, backup, replica epoch, "caught_up" | "unreachable"], ...]."""

    op = "replica_report"
    node_id: str
    reports: list


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


class RestoreCluster(Ranged, Message):
    """Roll every partition back to a checkpoint (the latest: None) or a savepoint."""

    op = "restore_cluster"
    ranges = {"checkpoint": (0, I64)}
    checkpoint: int | None = None
    savepoint: str | None = None


class CreateSavepoint(Ranged, Message):
    op = "create_savepoint"
    ranges = {"checkpoint": (0, I64)}
    name: str
    checkpoint: int | None = None


class InspectCheckpoint(Ranged, Message):
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


class Events(Ranged, Message):
    """Cluster events with a sequence number above ``after``, waiting up to ``wait`` seconds for one."""

    op = "events"
    ranges = {"after": (0, None), "wait": (0, None)}
    after: int = 0
    wait: float = 0.0


class Status(Message):
    """Nodes, partitions per node, epoch, recent events."""

    op = "status"
