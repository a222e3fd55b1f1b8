"""Checkpoints: barrier snapshots of every partition, incremental upload, restore, savepoints.

Layers (as in Flink's RocksDB backend):

- ``storage``: the external layout over fsspec URLs (file://, s3://, ...).
- ``manifest``: the partition manifest and the checkpoint ``_metadata``.
- ``snapshot``: a process's sync phase (one hard-link RocksDB checkpoint of its store)
  and async phase (incremental upload).
- ``restore``: a partition from its manifest; choosing a checkpoint, with fallback.
- ``savepoint``: self-contained copies by server-side copy.
- ``coordinator``: the I/O-free state machine (triggers, acks, timeouts, retention).
- ``participants``: what a checkpoint asks of whoever holds partitions, and
  ``LocalPartitions``, a process's own (the embedded store's, a node's).
- ``driver``: the one driver that carries out the state machine's decisions
  with the participants (embedded, and the cluster's in ``cluster/checkpointing.py``).
- ``local``: the embedded store's synchronous face on the driver.
"""

from .coordinator import CheckpointCoordinator, CheckpointPolicy, CheckpointRecord
from .manifest import CheckpointMetadata, FileEntry, PartitionManifest
from .restore import RestoreResult, SkippedCheckpoint, restore_partition
from .savepoint import SavepointInfo
from .snapshot import Snapshotter
from .storage import CheckpointStorage

__all__ = [
    "CheckpointCoordinator",
    "CheckpointMetadata",
    "CheckpointPolicy",
    "CheckpointRecord",
    "CheckpointStorage",
    "FileEntry",
    "PartitionManifest",
    "RestoreResult",
    "SavepointInfo",
    "SkippedCheckpoint",
    "Snapshotter",
    "restore_partition",
]
