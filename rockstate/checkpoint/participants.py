"""Who takes part in a checkpoint: the interface the driver speaks, and a process's own partitions behind it.

A ``Participant`` holds some partitions and does three things with them:
snapshot them for checkpoint N, hear how N ended, and restore them from a
checkpoint. ``LocalPartitions`` does these on one process's ``Store``: the
embedded store's driver calls it directly, and a cluster node serves it to
the coordinator's driver over RPC (``cluster/checkpointing.py``).

A snapshot runs each partition's sync phase (a hard-link RocksDB checkpoint
under the partition's write lock: its writes pause only for their own) and
then its uploads, ``SNAPSHOT_THREADS`` partitions at once, off the event loop
(a hard-link checkpoint waits on file syncs, ~20-40 ms, not on the CPU: one
after the other, P=1024 took seconds per node); the answer is one manifest
per partition. A restore fetches every partition's
files into ``<store>/restoring/`` first, then swaps them in at once
(``Store.replace_partitions``), so a failure leaves the partitions as they were.
The work is blocking I/O: it runs in threads.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, Sequence

from ..config import CheckpointConfig
from ..store import Store
from ..store.store import partition_dir
from .manifest import PartitionManifest
from .restore import PartitionRestore, PartitionTarget, load_manifests, load_metadata, restore_partitions
from .snapshot import Snapshotter
from .storage import CheckpointStorage


SNAPSHOT_THREADS = 16  # partitions snapshotted at once


class Participant(Protocol):
    async def snapshot(self, checkpoint_id: int, retained: Sequence[int], partitions: list[int]) -> list[PartitionManifest | dict]:
        """Barrier ``checkpoint_id``: snapshot and upload ``partitions``; one manifest each."""

    async def finish(self, checkpoint_id: int, completed: bool, partitions: list[int]) -> None:
        """Checkpoint ``checkpoint_id`` completed (its files may be referenced) or was aborted (its files go)."""

    async def restore(self, checkpoint_id: int, partitions: list[int], base: str = "") -> list[PartitionRestore]:
        """Replace ``partitions`` by their copies in a checkpoint (in ``base``: a savepoint's folder)."""


Holding = tuple[Participant, list[int]]  # a participant and the partitions it holds


class LocalPartitions:
    """The partitions of ``store`` as a participant."""

    def __init__(self, store: Store, config: CheckpointConfig, storage: CheckpointStorage | None = None,
                 keys: tuple[bytes, ...] = ()) -> None:
        """``keys``: the checkpoint keys (``Security.checkpoint_keys``): restores refuse a ``_metadata`` without their HMAC."""
        self.store, self.storage = store, storage or CheckpointStorage.of(config, keys)
        self.snapshotter = Snapshotter(self.storage, os.path.join(store.path, "checkpoints"), config.local_snapshots)
        self.verify_local = config.verify_local
        self._cancel: dict[int, threading.Event] = {}  # set when the checkpoint is aborted: uploads stop

    def __str__(self) -> str:
        return f"the store at {self.store.path}"

    async def snapshot(self, checkpoint_id: int, retained: Sequence[int], partitions: list[int]) -> list[PartitionManifest]:
        cancel = self._cancel.setdefault(checkpoint_id, threading.Event())

        def one(pid: int) -> PartitionManifest:  # each partition's writes pause only for its own sync phase
            snap = self.snapshotter.sync_phase(self.store.partition(pid), checkpoint_id)
            return self.snapshotter.async_phase(snap, retained, cancel)

        pool = ThreadPoolExecutor(max(1, min(SNAPSHOT_THREADS, len(partitions))), thread_name_prefix="rockstate-snapshot")
        loop = asyncio.get_running_loop()
        try:
            return list(await asyncio.gather(*(loop.run_in_executor(pool, one, pid) for pid in partitions)))
        except BaseException:  # failed, timed out or cancelled: uploads still running stop before their next file
            cancel.set()
            raise
        finally:
            pool.shutdown(wait=False, cancel_futures=True)  # never waited for on the loop
            self._cancel.pop(checkpoint_id, None)

    async def finish(self, checkpoint_id: int, completed: bool, partitions: list[int]) -> None:
        if not completed and checkpoint_id in self._cancel:
            self._cancel[checkpoint_id].set()
        done = self.snapshotter.confirm if completed else self.snapshotter.abort
        await asyncio.to_thread(lambda: [done(pid, checkpoint_id) for pid in partitions])  # file I/O: not on the loop

    async def restore(self, checkpoint_id: int, partitions: list[int], base: str = "") -> list[PartitionRestore]:
        return await asyncio.to_thread(self._restore, checkpoint_id, partitions, base)

    def _restore(self, checkpoint_id: int, partitions: list[int], base: str) -> list[PartitionRestore]:
        meta = load_metadata(self.storage, checkpoint_id, base)
        manifests = load_manifests(self.storage, meta, partitions, base)
        staging = os.path.join(self.store.path, "restoring")
        targets = [PartitionTarget(manifests[pid], os.path.join(staging, partition_dir(pid)), self._local_dirs(manifests[pid]))
                   for pid in partitions]
        try:
            stats = restore_partitions(self.storage, targets, base, self.verify_local)
            self.store.replace_partitions({t.manifest.partition: t.target for t in targets}, meta.states)
        finally:  # what is left of a failed one (a swapped-in copy is no longer there)
            for t in targets:
                shutil.rmtree(t.target, ignore_errors=True)
        for pid in partitions:  # a savepoint's files are its own: checkpoints must not reference them
            self.snapshotter.reset(pid, manifests[pid], reference=not base)
        return stats

    def _local_dirs(self, manifest: PartitionManifest) -> tuple[str, ...]:
        """The partition's local snapshots to take files from, the restored checkpoint's own first."""
        local = self.snapshotter.local_snapshots(manifest.partition)
        return tuple(local[c] for c in sorted(local, key=lambda c: (c != manifest.checkpoint_id, -c)))

    def drop(self, pid: int) -> None:
        """The partition left this process: its local snapshots, upload record and any half-restored copy go."""
        self.snapshotter.drop_partition(pid)
        shutil.rmtree(os.path.join(self.store.path, "restoring", partition_dir(pid)), ignore_errors=True)
