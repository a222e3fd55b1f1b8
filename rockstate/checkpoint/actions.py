"""Carrying out the checkpoint coordinator's actions against the storage.

The state machine in ``coordinator.py`` does no I/O; these functions do it
for whichever process drives it (the embedded driver in ``local.py``, the
cluster's coordinator). All of them block: call them from a thread
(``asyncio.to_thread``) in an event loop. All of them may be retried.
"""

from __future__ import annotations

import logging
import time

from ..errors import CorruptCheckpointError
from .coordinator import Aborted, CheckpointCoordinator, CheckpointPolicy, CheckpointRecord, Completed, CompletedCheckpoint, Discard, WriteMetadata, plan_sweep
from .restore import load_manifests, load_metadata
from .storage import CheckpointStorage, checkpoint_dir, checkpoint_id_of, metadata_path, referenced_paths

log = logging.getLogger(__name__)


def load_coordinator(storage: CheckpointStorage, partitions: int, policy: CheckpointPolicy | None = None) -> CheckpointCoordinator:
    """A coordinator that continues after the checkpoints the storage holds and knows what the completed ones reference.

    Reads every completed checkpoint's ``_metadata`` and manifests (in parallel).
    An unreadable one is left out of retention (the sweep removes it later).
    """
    completed = []
    for chk in storage.completed_ids():
        try:
            meta = load_metadata(storage, chk)
            manifests = load_manifests(storage, meta)
        except CorruptCheckpointError as exc:
            log.warning("checkpoint %s in %s is unreadable (%s); it is left out of retention", chk, storage.url, exc.message)
            continue
        paths = referenced_paths(manifests.values(), chk)
        record = CheckpointRecord(chk, "COMPLETED", "storage", meta.created_at, meta.partitions, meta.duration, meta.size, meta.uploaded_bytes)
        completed.append(CompletedCheckpoint(chk, paths, record))
    return CheckpointCoordinator(partitions, policy, storage.cluster, storage.checkpoint_ids(), completed)


def write_metadata(storage: CheckpointStorage, action: WriteMetadata) -> None:
    """The commit point: once this returns, the checkpoint exists."""
    key = storage.keys[0] if storage.keys else None  # signed: a _metadata planted in the storage is refused
    storage.write_bytes(metadata_path(action.checkpoint_id), action.metadata.to_json(key))


def collect_garbage(storage: CheckpointStorage, done: Completed, coordinator: CheckpointCoordinator, sweep: bool = True) -> None:
    """Delete the checkpoints beyond retention and the files no retained checkpoint uses; then ``gc_done``.

    ``sweep`` also lists the storage and deletes what no retained checkpoint
    uses (leftovers of aborted checkpoints and dead uploads), when the
    coordinator says one is due (``sweep_due``). A failure is
    logged, not raised: the checkpoint is complete, and a later sweep
    deletes what is left.
    """
    try:
        for chk in done.drop_checkpoints:
            storage.delete([metadata_path(chk)])  # first: never a half-deleted checkpoint that looks complete
            storage.delete_tree(checkpoint_dir(chk))
        storage.delete(done.delete_files)
        if sweep and coordinator.sweep_due(time.time()):
            garbage = plan_sweep(storage.list(), coordinator.retained_paths())
            for chk in sorted({checkpoint_id_of(p) for p in garbage} - {None}):
                storage.delete_tree(checkpoint_dir(chk))  # the folder too, not only its files
            storage.delete([p for p in garbage if checkpoint_id_of(p) is None])
            coordinator.swept(time.time())
    except Exception as exc:
        log.warning("garbage collection after checkpoint %s failed: %s", done.record.checkpoint_id, exc)
    finally:
        coordinator.gc_done()


def remove_aborted(storage: CheckpointStorage, aborted: Aborted | Discard) -> None:
    """Delete what an aborted checkpoint (or a late ack of one) uploaded. Failures are logged."""
    try:
        storage.delete(aborted.delete_files)
        if isinstance(aborted, Aborted):
            storage.delete_tree(aborted.delete_dir)
    except Exception as exc:
        chk = aborted.record.checkpoint_id if isinstance(aborted, Aborted) else aborted.checkpoint_id
        log.warning("removing the files of aborted checkpoint %s failed: %s", chk, exc)
