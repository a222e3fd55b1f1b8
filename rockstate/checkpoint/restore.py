"""Restore: one partition from its manifest, and the choice of a checkpoint to restore.

``restore_partition`` fills an empty directory with a partition's RocksDB
files: each file is taken from a local snapshot when one holds a file of the
same name, size and checksum (SSTs are hard-linked, the small private files
copied, since RocksDB may rewrite those), else downloaded, in parallel; every
file is checked against the manifest's size and checksum. A missing or bad
file raises ``CorruptCheckpointError`` naming it.

``restore_with_fallback`` tries the requested (or latest) completed
checkpoint, and on a corrupt or missing file falls back to the previous
completed one, and so on; each skip is logged as a warning and returned.
A checkpoint without ``_metadata`` was never completed and is never used.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Iterable, Sequence, TypeVar

from ..errors import CheckpointNotFoundError, CorruptCheckpointError, UnsafePathError
from ..names import create_new, inside
from .manifest import (CHUNK, CheckpointMetadata, FileEntry, ManifestRef, PartitionManifest, checksum_bytes, checksum_file, digest_bytes,
                       from_group, is_group, unbundle)
from .storage import CheckpointStorage, check_base, join, metadata_path

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class PartitionRestore:
    """How one partition was restored."""

    partition: int
    checkpoint_id: int
    files_local: int = 0  # taken from a local snapshot (hard link or copy)
    files_downloaded: int = 0
    bytes_local: int = 0
    bytes_downloaded: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class SkippedCheckpoint:
    checkpoint_id: int
    reason: str


@dataclass
class RestoreResult:
    """What a restore did: the checkpoint it restored, the ones it skipped, and per partition how."""

    checkpoint_id: int
    source: str  # "checkpoint" or "savepoint <name>"
    skipped: list[SkippedCheckpoint] = field(default_factory=list)
    partitions: list[PartitionRestore] = field(default_factory=list)
    seconds: float = 0.0  # all of it
    fetch_seconds: float = 0.0  # getting the files in place (download or local copy, checked)
    open_seconds: float = 0.0  # swapping the partitions in and opening them

    def to_dict(self) -> dict:
        return {**self.__dict__, "skipped": [s.__dict__ for s in self.skipped], "partitions": [p.to_dict() for p in self.partitions]}

    @classmethod
    def from_dict(cls, data: dict) -> "RestoreResult":
        return cls(**{**data, "skipped": [SkippedCheckpoint(**s) for s in data["skipped"]],
                      "partitions": [PartitionRestore(**p) for p in data["partitions"]]})

    @property
    def fell_back(self) -> bool:
        return bool(self.skipped)

    @property
    def bytes_downloaded(self) -> int:
        return sum(p.bytes_downloaded for p in self.partitions)

    @property
    def bytes_local(self) -> int:
        return sum(p.bytes_local for p in self.partitions)


# -- reading a checkpoint's description ------------------------------------------------


def load_metadata(storage: CheckpointStorage, checkpoint_id: int, base: str = "") -> CheckpointMetadata:
    """Checkpoint ``checkpoint_id``'s ``_metadata``, its HMAC checked when the storage has keys (see ``manifest``)."""
    rel = join(check_base(base), metadata_path(checkpoint_id))
    try:
        data = storage.read_bytes(rel)
    except CorruptCheckpointError:
        raise CheckpointNotFoundError(f"checkpoint {checkpoint_id} is not completed in {storage.url} (no {rel})", checkpoint_id=checkpoint_id) from None
    meta = CheckpointMetadata.from_json(data, rel, storage.keys, storage.accept_unsigned)
    if meta.checkpoint_id != checkpoint_id:
        raise CorruptCheckpointError(f"{rel} describes checkpoint {meta.checkpoint_id}", path=rel)
    return meta


def load_manifest(storage: CheckpointStorage, meta: CheckpointMetadata, pid: int, base: str = "") -> PartitionManifest:
    """A partition's manifest, checked against the size, checksum and SHA-256 ``_metadata`` gives it."""
    return load_manifests(storage, meta, [pid], base)[pid]


def load_manifests(storage: CheckpointStorage, meta: CheckpointMetadata, pids: Iterable[int] | None = None, base: str = "") -> dict[int, PartitionManifest]:
    """The partitions' manifests, each file read, checked and parsed once (a group holds a process's partitions)."""
    pids = list(range(meta.partitions) if pids is None else pids)
    files = dict(zip(*_read_each(storage, {join(base, meta.manifest_ref(p).path) for p in pids})))
    groups: dict[str, dict[int, PartitionManifest]] = {}  # a group's file -> its manifests, checked
    out = {}
    for pid in pids:
        ref = meta.manifest_ref(pid)
        rel = join(base, ref.path)
        if rel not in groups:
            groups[rel] = _group(files[rel], ref, rel)
        group = groups[rel]
        if group and pid not in group:
            raise CorruptCheckpointError(f"{rel} holds no manifest of p{pid}", path=rel)
        manifest = group[pid] if group else _single(files[rel], ref, pid, rel)
        if (manifest.partition, manifest.checkpoint_id) != (pid, meta.checkpoint_id):
            raise CorruptCheckpointError(f"{rel} is the manifest of p{manifest.partition} in checkpoint {manifest.checkpoint_id}", path=rel)
        out[pid] = manifest
    return out


def _checked(data: bytes, ref: ManifestRef, rel: str) -> bytes:
    if len(data) != ref.size or checksum_bytes(data) != ref.checksum:
        raise CorruptCheckpointError(f"{rel} does not match its size and checksum in _metadata", path=rel)
    if ref.digest and digest_bytes(data) != ref.digest:  # _metadata is signed and names the manifest's SHA-256
        raise CorruptCheckpointError(f"{rel} does not match its SHA-256 in _metadata", path=rel)
    return data


def _group(data: bytes, ref: ManifestRef, rel: str) -> dict[int, PartitionManifest]:
    """The manifests of a group (format 3), checked whole; none: the file is another kind."""
    if not data.startswith(b'{"async_seconds"') or b'"partitions":[' not in data:  # (canonical JSON: keys in order)
        return {}
    _checked(data, ref, rel)
    try:
        d = json.loads(data)
        return {m.partition: m for m in from_group(d)} if is_group(d) else {}
    except CorruptCheckpointError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptCheckpointError(f"{rel} is unreadable: {type(exc).__name__}: {exc}", path=rel) from None


def _single(data: bytes, ref: ManifestRef, pid: int, rel: str) -> PartitionManifest:
    """One partition's manifest: the file itself (format 1), or its text in a bundle (format 2)."""
    return PartitionManifest.from_json(_checked(unbundle(data, pid, rel), ref, rel), rel)


def _read_each(storage: CheckpointStorage, paths: set[str]) -> tuple[list[str], list[bytes]]:
    ordered = sorted(paths)
    return ordered, storage.parallel(storage.read_bytes, ordered)


# -- restoring partitions ---------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionTarget:
    """One partition to restore: its manifest, the new directory to fill, local snapshot directories to take files from."""

    manifest: PartitionManifest
    target: str
    local_dirs: tuple[str, ...] = ()


def restore_partition(
    storage: CheckpointStorage,
    manifest: PartitionManifest,
    target: str,
    local_dirs: Iterable[str] = (),
    base: str = "",
    verify_local: bool = True,
) -> PartitionRestore:
    """Fill the new directory ``target`` with the partition's files; on failure ``target`` is removed.

    ``local_dirs``: local snapshot directories of the partition to take files
    from, best first. ``base``: the folder the manifest's paths are relative to
    (a savepoint's). May be retried.
    """
    return restore_partitions(storage, [PartitionTarget(manifest, target, tuple(local_dirs))], base, verify_local)[0]


def restore_partitions(
    storage: CheckpointStorage, parts: Sequence[PartitionTarget], base: str = "", verify_local: bool = True
) -> list[PartitionRestore]:
    """``restore_partition`` for several partitions at once: every file of every partition on one pool.

    On failure every target is removed. May be retried.
    """
    start = time.perf_counter()
    check_base(base)
    for part in parts:  # every destination is one path component inside its target (from_dict checked; a manifest built otherwise too)
        try:
            names = [inside(part.target, e.name, "file name in a manifest") for e in part.manifest.files]
        except UnsafePathError as exc:
            raise CorruptCheckpointError(exc.message, checkpoint_id=part.manifest.checkpoint_id, partition=part.manifest.partition) from None
        if len(set(names)) != len(names):
            raise CorruptCheckpointError(f"the manifest of p{part.manifest.partition} names a file twice",
                                         checkpoint_id=part.manifest.checkpoint_id, partition=part.manifest.partition)
    jobs: list[tuple[int, FileEntry, list[str]]] = []
    for i, part in enumerate(parts):
        index: dict[str, list[str]] = {}
        for d in part.local_dirs:
            try:
                for name in os.listdir(d):
                    index.setdefault(name, []).append(os.path.join(d, name))
            except FileNotFoundError:
                continue
        if os.path.exists(part.target):
            shutil.rmtree(part.target)
        os.makedirs(part.target)
        jobs += [(i, entry, index.get(entry.name, [])) for entry in part.manifest.files]

    def fetch(job: tuple[int, FileEntry, list[str]]) -> tuple[int, bool, int]:
        i, entry, candidates = job
        manifest, dest = parts[i].manifest, inside(parts[i].target, entry.name)
        source = _local_copy(entry, candidates, verify_local)
        if source is not None:
            os.link(source, dest) if entry.shared else _copy_new(source, dest)  # RocksDB may rewrite private files
            return i, True, entry.size
        try:
            return i, False, storage.download(join(base, entry.path), dest, entry.size, entry.checksum, exclusive=True)
        except CorruptCheckpointError as exc:
            exc.data.update(checkpoint_id=manifest.checkpoint_id, partition=manifest.partition)
            raise

    stats = [PartitionRestore(p.manifest.partition, p.manifest.checkpoint_id) for p in parts]
    try:
        for i, local, size in storage.parallel(fetch, jobs):
            if local:
                stats[i].files_local += 1
                stats[i].bytes_local += size
            else:
                stats[i].files_downloaded += 1
                stats[i].bytes_downloaded += size
    except BaseException:
        for part in parts:
            shutil.rmtree(part.target, ignore_errors=True)
        raise
    for st in stats:
        st.seconds = time.perf_counter() - start
    return stats


def _copy_new(source: str, dest: str) -> None:
    """Copy ``source`` to the new file ``dest`` (never through a symlink, never over a file)."""
    with open(source, "rb", buffering=0) as src, create_new(dest) as dst:
        while chunk := src.read(CHUNK):
            dst.write(chunk)


def _local_copy(entry: FileEntry, candidates: Iterable[str], verify: bool) -> str | None:
    for path in candidates:
        try:
            if os.path.getsize(path) != entry.size:
                continue
            if verify and checksum_file(path)[1] != entry.checksum:
                continue
        except FileNotFoundError:
            continue
        return path
    return None


# -- choosing the checkpoint --------------------------------------------------------------


def candidates(storage: CheckpointStorage, checkpoint_id: int | None = None, base: str = "") -> list[int]:
    """Completed checkpoints to try, newest first: ``checkpoint_id`` (or the latest), then older ones."""
    completed = storage.completed_ids(base)
    if checkpoint_id is not None:
        if checkpoint_id not in completed:
            raise CheckpointNotFoundError(
                f"no completed checkpoint {checkpoint_id} in {storage.url} (completed: {completed[-10:] or 'none'})", checkpoint_id=checkpoint_id
            )
        completed = [c for c in completed if c <= checkpoint_id]
    if not completed:
        raise CheckpointNotFoundError(f"no completed checkpoint in {storage.url}/{storage.cluster}")
    return sorted(completed, reverse=True)


async def restore_with_fallback(
    storage: CheckpointStorage,
    attempt: Callable[[CheckpointMetadata], Awaitable[T]],
    ids: list[int],
    fallback: bool = True,
    base: str = "",
    on_skip: Callable[[SkippedCheckpoint], None] = lambda skipped: None,
) -> tuple[CheckpointMetadata, T, list[SkippedCheckpoint]]:
    """Await ``attempt`` on each checkpoint of ``ids`` in turn until one is not corrupt.

    ``attempt`` must leave nothing half-done when it raises CorruptCheckpointError.
    """
    skipped: list[SkippedCheckpoint] = []
    for chk in ids:
        try:
            meta = await asyncio.to_thread(load_metadata, storage, chk, base)
            return meta, await attempt(meta), skipped
        except (CorruptCheckpointError, CheckpointNotFoundError) as exc:
            skipped.append(SkippedCheckpoint(chk, exc.message))
            on_skip(skipped[-1])
            if not fallback:
                raise
            log.warning("checkpoint %s cannot be restored (%s); trying the previous one", chk, exc.message)
    raise CorruptCheckpointError(
        "no checkpoint could be restored: " + "; ".join(f"{s.checkpoint_id}: {s.reason}" for s in skipped),
        skipped=[s.__dict__ for s in skipped],
    )
