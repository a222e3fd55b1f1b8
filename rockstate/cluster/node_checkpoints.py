"""A node's part in checkpoints: snapshot and upload its partitions, restore them.

The coordinator sends the barrier for checkpoint N with the partitions this
node owns. The sync phase of each partition (a hard-link RocksDB checkpoint
under the partition's write lock) runs first for all of them, then the
uploads run in parallel; the answer is one manifest per partition. The work
is blocking I/O, so it runs in threads; a write that meets a partition in its
sync phase waits for that lock only.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading

from ..config import CheckpointConfig
from ..store import Store
from ..store.store import partition_dir
from ..checkpoint.restore import load_manifest, load_metadata, restore_partition
from ..checkpoint.snapshot import Snapshotter
from ..checkpoint.storage import CheckpointStorage


class NodeCheckpoints:
    def __init__(self, store: Store, config: CheckpointConfig) -> None:
        self.store = store
        self.storage = CheckpointStorage(config.url, config.storage_options, config.cluster, config.transfer_threads)
        self.snapshotter = Snapshotter(self.storage, os.path.join(store.path, "checkpoints"), config.local_snapshots)
        self.verify_local = config.verify_local
        self._cancel: dict[int, threading.Event] = {}

    async def snapshot(self, checkpoint_id: int, retained: list[int], pids: list[int]) -> list[dict]:
        cancel = self._cancel.setdefault(checkpoint_id, threading.Event())
        snaps = []
        for pid in pids:  # each partition's writes pause only for its own sync phase
            snaps.append(await asyncio.to_thread(self.snapshotter.sync_phase, self.store.partition(pid), checkpoint_id))
        try:
            manifests = await asyncio.gather(*(
                asyncio.to_thread(self.snapshotter.async_phase, snap, retained, cancel) for snap in snaps
            ))
        finally:
            self._cancel.pop(checkpoint_id, None)
        return [m.to_dict() for m in manifests]

    def confirm(self, checkpoint_id: int, pids: list[int]) -> None:
        for pid in pids:
            self.snapshotter.confirm(pid, checkpoint_id)

    def abort(self, checkpoint_id: int, pids: list[int]) -> None:
        event = self._cancel.get(checkpoint_id)
        if event is not None:
            event.set()
        for pid in pids:
            self.snapshotter.abort(pid, checkpoint_id)

    def restore(self, pid: int, checkpoint_id: int, base: str = "") -> dict:
        """Replace the partition's local copy with the checkpoint's (blocking; run it in a thread).

        The files are fetched and verified into a staging folder first, so a
        failure leaves the partition as it was.
        """
        meta = load_metadata(self.storage, checkpoint_id, base)
        manifest = load_manifest(self.storage, meta, pid, base)
        staging = os.path.join(self.store.path, "restoring", partition_dir(pid))
        local = list(self.snapshotter.local_snapshots(pid).values()) if not base else []
        stats = restore_partition(self.storage, manifest, staging, local, base, self.verify_local)
        self.store.close_partition(pid, drop=True)
        os.replace(staging, self.store.partition_path(pid))
        self.store.open_partition(pid)
        self.snapshotter.reset(pid, manifest, reference=not base)
        return stats.to_dict()

    def drop(self, pid: int) -> None:
        self.snapshotter.drop_partition(pid)
        shutil.rmtree(os.path.join(self.store.path, "restoring", partition_dir(pid)), ignore_errors=True)
