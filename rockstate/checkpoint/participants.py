"""Who takes part in a checkpoint: the interface the driver speaks, and a process's own partitions behind it.

A ``Participant`` holds some partitions and does three things with them:
snapshot them for checkpoint N, hear how N ended, and restore them from a
checkpoint. ``LocalPartitions`` does these on one process's ``Store``: the
embedded store's driver calls it directly, and a cluster node serves it to
the coordinator's driver over RPC (``cluster/checkpointing.py``).

A snapshot is one RocksDB checkpoint of the process's store, whatever its
number of partitions (``snapshot.py``), then its uploads, off the event loop;
the answer is one manifest per partition, each naming the same files and its
own key group in them. A restore fetches the files of each checkpoint of a
process once, into ``<store>/restoring/``, then imports each partition's
range (``Store.replace_partitions``), so a failure leaves the partitions as
they were. The work is blocking I/O: it runs in threads.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from typing import Protocol, Sequence

from ..config import CheckpointConfig
from ..store import Store
from .manifest import PartitionManifest
from .restore import PartitionRestore, PartitionTarget, load_manifests, load_metadata, restore_partitions
from .snapshot import Snapshotter
from .storage import CheckpointStorage


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
        self.snapshotter = Snapshotter(self.storage, os.path.join(store.path, "checkpoints"), config.local_snapshots, owner(store))
        self.verify_local = config.verify_local
        self._cancel: dict[int, threading.Event] = {}  # set when the checkpoint is aborted: uploads stop

    def __str__(self) -> str:
        return f"the store at {self.store.path}"

    async def snapshot(self, checkpoint_id: int, retained: Sequence[int], partitions: list[int]) -> list[PartitionManifest]:
        cancel = self._cancel.setdefault(checkpoint_id, threading.Event())
        for pid in partitions:
            self.store.partition(pid)  # not open here: refused before anything is taken
        try:
            return await asyncio.to_thread(self.snapshotter.snapshot, self.store.db, checkpoint_id, partitions, retained, cancel)
        except BaseException:  # failed, timed out or cancelled: uploads still running stop before their next file
            cancel.set()
            raise
        finally:
            self._cancel.pop(checkpoint_id, None)

    async def finish(self, checkpoint_id: int, completed: bool, partitions: list[int]) -> None:
        if not completed and checkpoint_id in self._cancel:
            self._cancel[checkpoint_id].set()
        done = self.snapshotter.confirm if completed else self.snapshotter.abort
        await asyncio.to_thread(done, checkpoint_id)  # file I/O: not on the loop

    async def restore(self, checkpoint_id: int, partitions: list[int], base: str = "") -> list[PartitionRestore]:
        return await asyncio.to_thread(self._restore, checkpoint_id, partitions, base)

    def _restore(self, checkpoint_id: int, partitions: list[int], base: str) -> list[PartitionRestore]:
        meta = load_metadata(self.storage, checkpoint_id, base)
        manifests = load_manifests(self.storage, meta, partitions, base)
        staging = os.path.join(self.store.path, "restoring")
        groups: dict[tuple[str, ...], list[int]] = {}  # a process's checkpoint: its files fetched once for all its partitions
        for pid in partitions:
            groups.setdefault(tuple(sorted(manifests[pid].paths)), []).append(pid)
        targets = [PartitionTarget(manifests[pids[0]], os.path.join(staging, f"copy-{i}"), self._local_dirs(manifests[pids[0]]))
                   for i, pids in enumerate(groups.values())]
        try:
            fetched = restore_partitions(self.storage, targets, base, self.verify_local)
            copies: dict[int, str | tuple[str, int | None]] = {}
            for target, pids in zip(targets, groups.values()):
                for pid in pids:
                    group = manifests[pid].key_group
                    copies[pid] = target.target if group is None else (target.target, group.partition)
            self.store.replace_partitions(copies, meta.states)
        finally:  # what is left of a failed one, and the fetched copies
            for t in targets:
                shutil.rmtree(t.target, ignore_errors=True)
        if base:
            self.snapshotter.forget()
        stats = []
        for st, pids in zip(fetched, groups.values()):  # the files counted once, on the group's first partition
            stats += [st] + [PartitionRestore(pid, st.checkpoint_id, seconds=st.seconds) for pid in pids[1:]]
        return stats

    def _local_dirs(self, manifest: PartitionManifest) -> tuple[str, ...]:
        """This store's local snapshots to take files from, the restored checkpoint's own first (none for another
        store's files: their names may be alike)."""
        if manifest.key_group is None or manifest.key_group.node != self.snapshotter.owner:
            return ()
        local = self.snapshotter.local_snapshots()
        return tuple(local[c] for c in sorted(local, key=lambda c: (c != manifest.checkpoint_id, -c)))


def owner(store: Store) -> str:
    """The name of the store's files in checkpoint storage."""
    return f"s{store.id}"
