"""Snapshot of one partition, in two phases (Flink's RocksIncrementalSnapshotStrategy).

Sync phase (``sync_phase``): the partition's memtables are flushed first,
*outside* the partition's lock, so little is left to flush; then, holding
``partition.lock`` (which every write holds), RocksDB takes a checkpoint: hard
links to the live SST files plus copies of the small private files, in
``<local_dir>/p0042/chk-000123``. The barrier is thereby ordered between two
writes: every write acknowledged before it is in the snapshot, none after it.
The partition's writes pause only for this, and the pause is measured.

Async phase (``async_phase``): upload the SST files the storage does not hold
yet, under unique names (``shared/p0042/000012-<uuid>.sst``), then the
private files (CURRENT, MANIFEST-*, OPTIONS-*, WAL), then the partition's
manifest ``chk-N/p0042.json``; return the manifest (the ack). RocksDB never
changes an SST file and numbers them uniquely within a database, so name and
size identify one within a partition; an SST already in the storage is
referenced, never uploaded again.

Which SSTs count as "in the storage" is the ``UploadTracker``'s job. It
references only the files of a checkpoint known to be *completed* (confirmed)
— never those of a pending one, whose files an abort may delete. Once a
restore takes a partition back in time, RocksDB may reuse file numbers, so a
restore resets the tracker to the restored manifest's files. A snapshot may
pass ``retained`` (the completed checkpoint ids the coordinator keeps): a
pending snapshot among them is confirmed (its notification may have been
lost), and a confirmed one no longer among them is forgotten (its files may be
deleted), so the tracker never references a file that garbage collection may
remove.

The last ``keep_local`` local snapshots stay on disk for fast local restore.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass
from typing import Collection

from ..errors import CheckpointAbortedError
from ..store.partition import Partition
from ..files import write_json
from .manifest import FileEntry, PartitionManifest
from .storage import CheckpointStorage, checkpoint_dir, checkpoint_id_of, manifest_path, private_path, shared_path

log = logging.getLogger(__name__)

SHARED_SUFFIXES = (".sst", ".blob")  # immutable files RocksDB numbers uniquely


def is_shared(name: str) -> bool:
    return name.endswith(SHARED_SUFFIXES)


@dataclass
class LocalSnapshot:
    """The result of the sync phase: a RocksDB checkpoint directory on local disk."""

    partition: int
    checkpoint_id: int
    path: str
    states: list[str]
    pause_seconds: float
    taken_at: float


class UploadTracker:
    """Which of one partition's SST files the storage holds, for which checkpoints.

    ``confirmed`` maps a local SST name to its entry in the last confirmed
    (completed) checkpoint; ``pending`` holds each unconfirmed snapshot's
    shared files. ``confirmed`` is kept in ``path`` so a restarted process goes
    on uploading incrementally: the transitions only mark it changed, and
    ``save`` writes it once per operation of the ``Snapshotter``. A
    confirmation's record is not synced to disk: losing it leaves an older
    record, which only makes the next snapshot upload more (``check_retained``
    forgets a checkpoint that is no longer kept). A restore's reset is synced:
    after it, RocksDB may reuse file names of the abandoned history.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.confirmed_id: int | None = None
        self.confirmed: dict[str, FileEntry] = {}
        self.pending: dict[int, dict[str, FileEntry]] = {}
        self._changed = False
        try:
            with open(path) as f:
                data = json.load(f)
            self.confirmed_id = data["checkpoint_id"]
            self.confirmed = {n: FileEntry.from_dict(e) for n, e in data["files"].items()}
        except FileNotFoundError:
            pass
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring unreadable upload record %s: the next checkpoint uploads every file", path)

    def known(self, name: str, size: int) -> FileEntry | None:
        entry = self.confirmed.get(name)
        return entry if entry is not None and entry.size == size else None

    def add_pending(self, checkpoint_id: int, entries: dict[str, FileEntry]) -> None:
        self.pending[checkpoint_id] = entries

    def confirm(self, checkpoint_id: int) -> bool:
        """Checkpoint ``checkpoint_id`` completed: its files may be referenced from now on."""
        if checkpoint_id not in self.pending or (self.confirmed_id is not None and checkpoint_id <= self.confirmed_id):
            return False
        self._set(checkpoint_id, self.pending[checkpoint_id])
        self.pending = {c: e for c, e in self.pending.items() if c > checkpoint_id}
        return True

    def abort(self, checkpoint_id: int) -> None:
        self.pending.pop(checkpoint_id, None)

    def reset(self, checkpoint_id: int | None, entries: dict[str, FileEntry]) -> None:
        """After a restore: the local files are exactly ``entries`` (empty: reference nothing)."""
        self.pending.clear()
        self._set(checkpoint_id, entries)

    def check_retained(self, retained: Collection[int]) -> None:
        """Confirm the newest pending snapshot the coordinator kept; forget a confirmed one it dropped."""
        for chk in sorted(self.pending, reverse=True):
            if chk in retained:
                self.confirm(chk)
                break
        if self.confirmed_id is not None and self.confirmed_id not in retained:
            log.info("checkpoint %s is no longer retained: its files will be uploaded again", self.confirmed_id)
            self._set(None, {})

    def _set(self, checkpoint_id: int | None, entries: dict[str, FileEntry]) -> None:
        self.confirmed_id, self.confirmed, self._changed = checkpoint_id, dict(entries), True

    def save(self, sync: bool = False) -> None:
        """Write the record if a transition changed it."""
        if not self._changed:
            return
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        write_json(self.path, {"checkpoint_id": self.confirmed_id, "files": {n: e.to_dict() for n, e in self.confirmed.items()}}, sync)
        self._changed = False


class Snapshotter:
    """Snapshots of a process's partitions into ``storage``; local snapshots under ``local_dir``.

    Thread-safe: different partitions may be snapshotted at once. Every
    method may be retried with the same arguments.
    """

    def __init__(self, storage: CheckpointStorage, local_dir: str, keep_local: int = 2) -> None:
        self.storage = storage
        self.local_dir = os.path.abspath(local_dir)
        self.keep_local = keep_local
        self._trackers: dict[int, UploadTracker] = {}
        self._mutex = threading.Lock()

    # -- paths -----------------------------------------------------------------

    def partition_dir(self, pid: int) -> str:
        return os.path.join(self.local_dir, f"p{pid:04d}")

    def local_path(self, pid: int, checkpoint_id: int) -> str:
        return os.path.join(self.partition_dir(pid), checkpoint_dir(checkpoint_id))

    def local_snapshots(self, pid: int) -> dict[int, str]:
        """checkpoint id -> directory, of the local snapshots of ``pid`` that are complete."""
        out = {}
        try:
            names = os.listdir(self.partition_dir(pid))
        except FileNotFoundError:
            return out
        for name in names:
            chk = checkpoint_id_of(name)
            path = os.path.join(self.partition_dir(pid), name)
            if chk is not None and os.path.exists(os.path.join(path, "CURRENT")):
                out[chk] = path
        return out

    def tracker(self, pid: int) -> UploadTracker:
        with self._mutex:
            if pid not in self._trackers:
                self._trackers[pid] = UploadTracker(os.path.join(self.partition_dir(pid), "uploaded.json"))
            return self._trackers[pid]

    # -- the two phases ----------------------------------------------------------

    def sync_phase(self, partition: Partition, checkpoint_id: int) -> LocalSnapshot:
        """Take the RocksDB checkpoint under the partition's lock; returns how long writes paused."""
        pid = partition.pid
        target = self.local_path(pid, checkpoint_id)
        if os.path.exists(target):  # left by an attempt that did not finish
            shutil.rmtree(target)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        pause = partition.hard_link_copy(target)
        return LocalSnapshot(pid, checkpoint_id, target, sorted(partition.states()), pause, time.time())

    def async_phase(
        self, snap: LocalSnapshot, retained: Collection[int] | None = None, cancel: threading.Event | None = None
    ) -> PartitionManifest:
        """Upload what the storage lacks, then the private files, then the manifest; returns the manifest.

        ``cancel`` set (the checkpoint was aborted) stops it before its next file.
        """
        start = time.perf_counter()
        pid, chk = snap.partition, snap.checkpoint_id
        tracker = self.tracker(pid)
        if retained is not None:
            tracker.check_retained(retained)
            tracker.save()
        names = sorted(os.listdir(snap.path))
        sizes = {n: os.path.getsize(os.path.join(snap.path, n)) for n in names}
        shared = [n for n in names if is_shared(n)]
        private = [n for n in names if not is_shared(n)]
        known = {n: tracker.known(n, sizes[n]) for n in shared}
        entries: dict[str, FileEntry] = {}
        for name, entry in known.items():
            if entry is not None:
                entries[name] = FileEntry(name, entry.path, entry.size, entry.checksum, True, uploaded=False)

        def upload(item: tuple[str, str, bool]) -> FileEntry:
            name, rel, is_sst = item
            _check(cancel, chk)
            size, checksum = self.storage.upload(os.path.join(snap.path, name), rel)
            return FileEntry(name, rel, size, checksum, is_sst, uploaded=True)

        new = [(n, shared_path(pid, n), True) for n in shared if known[n] is None]
        for entry in self.storage.parallel(upload, new):
            entries[entry.name] = entry
        for entry in self.storage.parallel(upload, [(n, private_path(chk, pid, n), False) for n in private]):
            entries[entry.name] = entry
        manifest = PartitionManifest(
            partition=pid,
            checkpoint_id=chk,
            files=[entries[n] for n in names],
            states=snap.states,
            created_at=snap.taken_at,
            sync_seconds=snap.pause_seconds,
        )
        manifest.async_seconds = time.perf_counter() - start
        _check(cancel, chk)
        self.storage.write_bytes(manifest_path(chk, pid), manifest.to_json())
        tracker.add_pending(chk, {e.name: e for e in manifest.files if e.shared})
        self._prune_local(pid)
        return manifest

    def snapshot(self, partition: Partition, checkpoint_id: int, retained: Collection[int] | None = None) -> PartitionManifest:
        """Both phases, one after the other."""
        return self.async_phase(self.sync_phase(partition, checkpoint_id), retained)

    # -- what the coordinator says afterwards ---------------------------------------

    def confirm(self, pid: int, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` is complete (its ``_metadata`` is written)."""
        tracker = self.tracker(pid)
        tracker.confirm(checkpoint_id)
        tracker.save()

    def abort(self, pid: int, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` was aborted: forget its uploads and its local snapshot."""
        self.tracker(pid).abort(checkpoint_id)
        shutil.rmtree(self.local_path(pid, checkpoint_id), ignore_errors=True)

    def reset(self, pid: int, manifest: PartitionManifest | None, reference: bool = True) -> None:
        """After ``pid`` was restored from ``manifest``: its SSTs are exactly the manifest's.

        ``reference=False`` (a restore from a savepoint, whose files a checkpoint
        must not depend on) makes the next checkpoint upload every file.
        """
        tracker = self.tracker(pid)
        if manifest is None or not reference:
            tracker.reset(None, {})
        else:
            tracker.reset(manifest.checkpoint_id, {e.name: e for e in manifest.files if e.shared})
        tracker.save(sync=True)

    def drop_partition(self, pid: int) -> None:
        """The partition left this process: its local snapshots and upload record go."""
        with self._mutex:
            self._trackers.pop(pid, None)
        shutil.rmtree(self.partition_dir(pid), ignore_errors=True)

    def _prune_local(self, pid: int) -> None:
        snaps = sorted(self.local_snapshots(pid))
        for chk in snaps[: max(0, len(snaps) - self.keep_local)]:
            shutil.rmtree(self.local_path(pid, chk), ignore_errors=True)


def _check(cancel: threading.Event | None, checkpoint_id: int) -> None:
    if cancel is not None and cancel.is_set():
        raise CheckpointAbortedError(f"checkpoint {checkpoint_id} was aborted", checkpoint_id=checkpoint_id)
