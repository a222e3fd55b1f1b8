"""Messages the coordinator serves, to nodes and clients."""

from __future__ import annotations

from .base import I64, Message, Ranged

MAX_TABLE_WAIT = 60.0  # seconds a GetTable may wait for a newer table

# -- served by the coordinator ---------------------------------------------------


class Register(Ranged, Message):
    """A node joins (or rejoins with its id); answers node_id, table, states."""

    op = "register"
    names = {"node_id": "node id", "zone": "zone"}
    address: str
    node_id: str | None = None
    zone: str | None = None


class ReplicaReport(Ranged, Message):
    """From a partition's primary: ``reports`` is [[pid, backup, replica epoch, "caught_up" | "unreachable"], ...]."""

    op = "replica_report"
    names = {"node_id": "node id"}
    node_id: str
    reports: list


class Heartbeat(Ranged, Message):
    """A node is alive; answers the current table epoch, so the node knows when to fetch it."""

    op = "heartbeat"
    names = {"node_id": "node id"}
    node_id: str
    epoch: int


class Leave(Ranged, Message):
    """A node leaves gracefully: its partitions move away first; answers when they have. ``drain``: an operator's
    drain of a node that keeps running: it stays a member that gets no partitions until ``Undrain``."""

    op = "leave"
    names = {"node_id": "node id"}
    node_id: str
    drain: bool = False


class Undrain(Ranged, Message):
    """A drained node gets partitions again."""

    op = "undrain"
    names = {"node_id": "node id"}
    node_id: str


class RemoveMember(Ranged, Message):
    """Forget a member that is gone (dead, left, or drained and stopped) and holds no partition."""

    op = "remove_member"
    names = {"node_id": "node id"}
    node_id: str


class GetTable(Ranged, Message):
    """The partition table. With ``wait``: once the coordinator has sent the nodes a table newer than epoch
    ``newer_than`` (at once if it has), None after ``wait`` seconds without one: a client retrying a partition
    that had no live owner takes its promotion as soon as the nodes have it."""

    op = "get_table"
    ranges = {"newer_than": (0, I64), "wait": (0, MAX_TABLE_WAIT)}
    newer_than: int = 0
    wait: float = 0.0

    def to_wire(self) -> dict:  # a coordinator of an earlier version knows neither field: sent only to wait
        wire = super().to_wire()
        if not self.wait:
            del wire["newer_than"], wire["wait"]
        return wire


class DefineState(Message):
    """Define a state (or check an existing one's kind and TTL); ``create=False``: only look it up."""

    op = "define_state"
    spec: dict
    create: bool = True


class ClusterStats(Message):
    op = "cluster_stats"


class Count(Ranged, Message):
    op = "count"
    names = {"state": "state name"}
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
    names = {"savepoint": "savepoint name"}
    checkpoint: int | None = None
    savepoint: str | None = None


class CreateSavepoint(Ranged, Message):
    op = "create_savepoint"
    ranges = {"checkpoint": (0, I64)}
    names = {"name": "savepoint name"}
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
