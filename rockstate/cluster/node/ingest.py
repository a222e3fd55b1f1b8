"""Bulk ingestion: sorted SST files built by a client, ingested whole into a state of a partition.

The client (a Spark task of ``rockstate.spark.bulk_load``) writes an SST file
with ``write_sst`` (rocksdict's ``SstFileWriter`` in raw mode: keys are the
stored RocksDB keys, strictly ascending; values the stored values, a TTL
header included) and hands it to ``ClusterBackend.ingest_sst``, which calls
``upload_and_ingest`` on the partition's owner:

1. ``IngestChunk`` messages carry the file's bytes, ``client/bulk.py``'s ``CHUNK`` at a time, into
   ``<store>/ingest/<upload>.sst`` on the node (an upload is a fresh random id;
   a chunk is written at its offset, so a resent chunk is harmless);
2. ``IngestSst(epoch, partition, state, upload, size, checksum)``: the node
   checks ownership as for a write (a frozen partition makes it wait, NOT_OWNER
   when the partition is not its own at that epoch), checks the file's size and
   CRC-32, and, holding the partition's write lock, ingests it into the state's
   column family (``ingest_external_file``, the file is moved, not copied).
   The upload is removed afterwards, whether the ingest succeeded or not.

Ingested entries overwrite the state's entries with the same keys, like a
``put_many``, and become visible at once, atomically per file. The whole of
1-2 may be retried (the client does, on NOT_OWNER, a moving partition or a
lost connection, with a new upload): ingesting the same file twice leaves the
same state. A partition that is being copied to another node (a move records
the writes it must hand over, and an ingest is not a recordable write) refuses
with a retryable ``PartitionUnavailableError`` until the move is over, so the
client then ingests at the new owner. The lock orders an ingest against a
checkpoint's barrier like any write: a checkpoint holds the file whole or not
at all. Ingests bypass staged micro-batches (exactly-once): they are not part
of any batch and are not undone by a rollback.

Uploads left behind by a client that died between 1 and 2 are removed by the
node after ``STALE_UPLOAD`` seconds.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
from contextlib import contextmanager
from typing import Awaitable, Callable, Iterator

from rocksdict import IngestExternalFileOptions, Rdict

from ...checkpoint.manifest import checksum_file
from ...errors import ClusterError, IngestUploadError, PartitionUnavailableError, UnknownStateError
from ...store import Store
from .. import protocol as p
from .ownership import Gate

STALE_UPLOAD = 3600.0
_UPLOAD = re.compile(r"^[0-9a-f]{32}$")


class SstIngestor:
    """A node's handlers for ``IngestChunk``, ``IngestSst`` and ``IngestAbort``."""

    def __init__(self, gate: Gate, store_of: Callable[[], Store], resync: Callable[[int], Awaitable[None]]) -> None:
        """``store_of()``: the store, open once the node registered; ``resync(pid)``: replication's, as an SST file is
        no batch the partition's backups could apply (returns at once when it has none)."""
        self.gate, self._store, self.resync = gate, store_of, resync
        self._last_sweep = 0.0

    @property
    def root(self) -> str:
        return os.path.join(self._store().path, "ingest")

    def _path(self, upload: str) -> str:
        if not _UPLOAD.match(upload):
            raise ClusterError(f"bad upload id {upload!r}: 32 lowercase hex digits expected")
        return os.path.join(self.root, f"{upload}.sst")

    async def chunk(self, msg: p.IngestChunk, conn: object) -> int:
        path = self._path(msg.upload)
        if msg.offset < 0:
            raise ClusterError(f"bad offset {msg.offset} for upload {msg.upload}")
        return await asyncio.to_thread(self._write_chunk, path, msg.offset, msg.data)

    def _write_chunk(self, path: str, offset: int, data: bytes) -> int:
        if offset == 0:
            self._sweep()
        os.makedirs(self.root, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.pwrite(fd, data, offset)
        finally:
            os.close(fd)
        return offset + len(data)

    async def abort(self, msg: p.IngestAbort, conn: object) -> None:
        _remove(self._path(msg.upload))

    async def ingest(self, msg: p.IngestSst, conn: object) -> int:
        path = self._path(msg.upload)
        try:
            # the same checks as a write: waits while the partition is frozen, NOT_OWNER if not ours at that epoch
            [pid] = await self.gate.writable([msg.partition], msg.epoch)
            size = await asyncio.to_thread(self._ingest, pid, msg, path)
        finally:
            _remove(path)
        await self.resync(pid)  # acknowledged once no backup without the file counts as in sync
        return size

    def _ingest(self, pid: int, msg: p.IngestSst, path: str) -> int:
        """Check the upload, then ingest it under the partition's write lock (blocking)."""
        try:
            size, checksum = checksum_file(path)
        except FileNotFoundError:
            raise IngestUploadError(f"upload {msg.upload} is not on node {self.gate.ownership.node_id}") from None
        if (size, checksum) != (msg.size, msg.checksum):
            raise IngestUploadError(f"upload {msg.upload} has {size} bytes ({checksum}); the client sent {msg.size} ({msg.checksum})")
        store = self._store()
        if msg.state not in store.specs:
            raise UnknownStateError(f"unknown state {msg.state!r}")
        part = store.partition(pid)
        part.ensure_state(msg.state)
        copy = path + ".db"  # the client's keys go behind the partition's prefix: through a RocksDB of the file alone
        shutil.rmtree(copy, ignore_errors=True)
        db = Rdict(copy, store.resources.options(), column_families={msg.state: store.resources.options()})
        try:
            options = IngestExternalFileOptions()
            options.set_move_files(True)
            db.get_column_family(msg.state).ingest_external_file([path], options)
        finally:
            db.close()

        @contextmanager
        def locked() -> Iterator[None]:
            with part.lock:
                self.gate.ownership.check_ingest(pid, msg.epoch)  # moved away, or being copied, while the file was checked
                if part.db is None:
                    raise PartitionUnavailableError(f"partition {pid} is closed (moving or being restored); retry", partition=pid)
                yield

        try:
            store.db.import_copies({pid: (copy, None)}, replace=False, locked=locked)
        finally:
            shutil.rmtree(copy, ignore_errors=True)
        return size

    def _sweep(self) -> None:
        """Remove uploads older than ``STALE_UPLOAD`` (their client died before ingesting them)."""
        now = time.time()
        if now - self._last_sweep < 60:
            return
        self._last_sweep = now
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return
        for name in names:
            path = os.path.join(self.root, name)
            try:
                if now - os.path.getmtime(path) > STALE_UPLOAD:
                    os.unlink(path)
            except FileNotFoundError:
                pass


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
