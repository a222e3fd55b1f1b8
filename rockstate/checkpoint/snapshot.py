"""Snapshot of a process's partitions, in two phases (Flink's RocksIncrementalSnapshotStrategy).

Every partition a process holds is a key group of its one RocksDB (``store/keygroups.py``), so a
checkpoint takes one RocksDB checkpoint per process, whatever its number of partitions.

Sync phase (``sync_phase``): the memtables are flushed first, so little is
left to flush; then RocksDB takes a checkpoint: hard links to the live SST
files plus copies of the small private files, in ``<local_dir>/chk-000123``.
A RocksDB checkpoint is one cut of the database's writes, and every write is
one WriteBatch, so every write acknowledged before it is in the snapshot
whole, none after it, in every partition alike.

Async phase (``async_phase``): upload the SST files the storage does not hold
yet, under unique names (``shared/<owner>/000012-<uuid>.sst``, ``owner`` the
store's id), then the private files (CURRENT, MANIFEST-*, OPTIONS-*), then a
manifest per partition -- the process's files, and the partition's key group
in them (``PartitionManifest.key_group``) -- as one group, ``chk-N/<owner>.json``:
the files listed once, then the partitions (``manifest.group_bytes``; one write, not one per
partition: 1,024 of them took a second). RocksDB never
changes an SST file and numbers them uniquely within a database, so name and
size identify one; an SST already in the storage is referenced, never
uploaded again.

Which SSTs count as "in the storage" is the ``UploadTracker``'s job. It
references only the files of a checkpoint known to be *completed* (confirmed)
— never those of a pending one, whose files an abort may delete. A snapshot may
pass ``retained`` (the completed checkpoint ids the coordinator keeps): a
pending snapshot among them is confirmed (its notification may have been
lost), and a confirmed one no longer among them is forgotten (its files may be
deleted), so the tracker never references a file that garbage collection may
remove. A restore from a checkpoint does not touch it (it ingests new files, never reuses a name); one from
a savepoint makes it forget everything (``forget``): checkpoints after it depend on nothing before.

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
from typing import Collection, Sequence

from ..errors import CheckpointAbortedError
from ..store.keygroups import NodeDB
from ..files import write_json
from .manifest import FileEntry, KeyGroup, PartitionManifest, group_bytes
from .storage import CheckpointStorage, group_path, checkpoint_dir, checkpoint_id_of, private_path, shared_path

log = logging.getLogger(__name__)

SHARED_SUFFIXES = (".sst", ".blob")  # immutable files RocksDB numbers uniquely


def is_shared(name: str) -> bool:
    return name.endswith(SHARED_SUFFIXES)


@dataclass
class LocalSnapshot:
    """The result of the sync phase: a RocksDB checkpoint directory on local disk."""

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

    def forget(self) -> None:
        self.pending.clear()
        self._set(None, {})

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
    """Snapshots of a process's store into ``storage`` under the name ``owner``; local snapshots under ``local_dir``.

    Every method may be retried with the same arguments.
    """

    def __init__(self, storage: CheckpointStorage, local_dir: str, keep_local: int = 2, owner: str = "") -> None:
        self.storage = storage
        self.local_dir = os.path.abspath(local_dir)
        self.keep_local = keep_local
        self.owner = owner
        self.tracker = UploadTracker(os.path.join(self.local_dir, "uploaded.json"))
        self._mutex = threading.Lock()  # one snapshot at a time: they share the tracker

    def local_path(self, checkpoint_id: int) -> str:
        return os.path.join(self.local_dir, checkpoint_dir(checkpoint_id))

    def local_snapshots(self) -> dict[int, str]:
        """checkpoint id -> directory, of the local snapshots that are complete."""
        out = {}
        try:
            names = os.listdir(self.local_dir)
        except FileNotFoundError:
            return out
        for name in names:
            chk = checkpoint_id_of(name)
            path = os.path.join(self.local_dir, name)
            if chk is not None and os.path.exists(os.path.join(path, "CURRENT")):
                out[chk] = path
        return out

    # -- the two phases ----------------------------------------------------------

    def sync_phase(self, db: NodeDB, checkpoint_id: int) -> LocalSnapshot:
        """Take the RocksDB checkpoint; ``pause_seconds``: how long it took (RocksDB's own pause of writes is within)."""
        target = self.local_path(checkpoint_id)
        if os.path.exists(target):  # left by an attempt that did not finish
            shutil.rmtree(target)
        os.makedirs(self.local_dir, exist_ok=True)
        db.flush()
        start = time.perf_counter()
        db.checkpoint(target)
        return LocalSnapshot(checkpoint_id, target, sorted(db.families), time.perf_counter() - start, time.time())

    def async_phase(self, snap: LocalSnapshot, partitions: Sequence[int], retained: Collection[int] | None = None,
                    cancel: threading.Event | None = None) -> list[PartitionManifest]:
        """Upload what the storage lacks, then the private files, then a manifest per partition; returns them.

        ``cancel`` set (the checkpoint was aborted) stops it before its next file.
        """
        start = time.perf_counter()
        chk, tracker = snap.checkpoint_id, self.tracker
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

        new = [(n, shared_path(self.owner, n), True) for n in shared if known[n] is None]
        for entry in self.storage.parallel(upload, new):
            entries[entry.name] = entry
        for entry in self.storage.parallel(upload, [(n, private_path(chk, self.owner, n), False) for n in private]):
            entries[entry.name] = entry
        files = [entries[n] for n in names]
        manifests = [PartitionManifest(partition=pid, checkpoint_id=chk, files=files, states=snap.states, created_at=snap.taken_at,
                                       sync_seconds=snap.pause_seconds, key_group=KeyGroup(self.owner, pid, len(partitions)))
                     for pid in partitions]
        _check(cancel, chk)
        took = time.perf_counter() - start
        for manifest in manifests:
            manifest.async_seconds = took
        if manifests:
            self.storage.write_bytes(group_path(chk, self.owner), group_bytes(manifests))
        tracker.add_pending(chk, {e.name: e for e in files if e.shared})
        self._prune_local()
        return manifests

    def snapshot(self, db: NodeDB, checkpoint_id: int, partitions: Sequence[int], retained: Collection[int] | None = None,
                 cancel: threading.Event | None = None) -> list[PartitionManifest]:
        """Both phases, one after the other."""
        with self._mutex:
            return self.async_phase(self.sync_phase(db, checkpoint_id), partitions, retained, cancel)

    # -- what the coordinator says afterwards ---------------------------------------

    def confirm(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` is complete (its ``_metadata`` is written)."""
        with self._mutex:
            if self.tracker.confirm(checkpoint_id):
                self.tracker.save()

    def abort(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` was aborted: forget its uploads and its local snapshot."""
        with self._mutex:
            self.tracker.abort(checkpoint_id)
            shutil.rmtree(self.local_path(checkpoint_id), ignore_errors=True)

    def forget(self) -> None:
        """Reference nothing uploaded so far: the next snapshot uploads every file (after a restore from a
        savepoint, so no checkpoint depends on files whose checkpoints are gone)."""
        with self._mutex:
            self.tracker.forget()
            self.tracker.save(sync=True)

    def _prune_local(self) -> None:
        snaps = sorted(self.local_snapshots())
        for chk in snaps[: max(0, len(snaps) - self.keep_local)]:
            shutil.rmtree(self.local_path(chk), ignore_errors=True)


def _check(cancel: threading.Event | None, checkpoint_id: int) -> None:
    if cancel is not None and cancel.is_set():
        raise CheckpointAbortedError(f"checkpoint {checkpoint_id} was aborted", checkpoint_id=checkpoint_id)
