"""Partitions' files handed to another node: a copy on the source (an export, ``NodeDB.export``), streamed, and written on the receiver.

A move's target and a new or returning backup both fetch a copy this way (``node/migration.py``,
``replication/copies.py``).
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
from typing import TYPE_CHECKING, AsyncGenerator, Callable

from ..errors import ClusterError, UnsafePathError
from ..names import create_new, inside
from ..rpc import Stream
from ..store import Store
from ..store.store import partition_dir

if TYPE_CHECKING:
    from ..store.partition import Partition

CHUNK = 4 << 20


class MoveSource:
    """Copies of partitions handed to other nodes (a move's target, a new backup), under ``<store>/<folder>/<name>``."""

    def __init__(self, store: Store, folder: str = "outgoing") -> None:
        self.store = store
        self.root = os.path.join(store.path, folder)

    def path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def take(self, parts: list[Partition], name: str, record: bool = False,
             then: Callable[[Partition], None] | None = None) -> None:
        """A copy of ``parts`` as one export ``name`` (blocking): each cut under its lock (``Partition.cut``);
        ``record``: record writes from then on; ``then(part)``: run under the partition's lock right after its cut."""
        cuts, db = {}, None
        for part in parts:
            db, cuts[part.pid] = part.cut(record, None if then is None else functools.partial(then, part))
        target = self.path(name)
        shutil.rmtree(target, ignore_errors=True)
        os.makedirs(self.root, exist_ok=True)
        if db is not None:
            db.export(cuts, target)

    def listing(self, name: str) -> list[list]:
        return [[f, os.path.getsize(os.path.join(self.path(name), f))] for f in sorted(os.listdir(self.path(name)))]

    def copy(self, pid: int) -> Stream:
        """Take the copy and start recording; answers its stream (blocking)."""
        self.take([self.store.partition(pid)], partition_dir(pid), record=True)
        return self.stream(partition_dir(pid))

    def stream(self, name: str) -> Stream:
        """Copy ``name``'s listing, then its files' bytes in that order."""
        files = self.listing(name)
        return Stream(files, self.chunks([(name, files)]))

    async def chunks(self, copies: list[tuple[str, list[list]]]) -> AsyncGenerator[bytes, None]:
        """The bytes of each copy's listed files ([(name, [[file, size], ...]), ...]), in that order."""
        for name, files in copies:
            for file, size in files:
                with open(os.path.join(self.path(name), file), "rb", buffering=0) as f:
                    while size:  # exactly the listed size: the receiver counts on it
                        data = await asyncio.to_thread(f.read, min(size, CHUNK))
                        if not data:
                            raise ClusterError(f"{file} of copy {name} ended {size} bytes short of its listing")
                        size -= len(data)
                        yield data

    def delta(self, pid: int, final: bool) -> list:
        """The writes since the copy or the last delta; ``final``: the partition is frozen, recording ends."""
        return self.store.partition(pid).take_recorded(stop=final)

    def discard(self, pid: int) -> None:
        shutil.rmtree(self.path(partition_dir(pid)), ignore_errors=True)
        try:
            self.store.partition(pid).take_recorded()
        except Exception:  # noqa: BLE001 -- the partition is gone already: nothing is recording
            pass


def receive_files(files: list, target: str, read_into: Callable[[memoryview], int]) -> int:
    """Write a copy's ``files`` ([[name, size], ...]), whose bytes ``read_into`` gives in that order, into ``target``
    (blocking: a worker thread's); answers their bytes."""
    shutil.rmtree(target, ignore_errors=True)
    os.makedirs(target)
    buffer = memoryview(bytearray(CHUNK))
    for name, size in files:  # one path component each, a new file inside target, never through a symlink
        if type(size) is not int or size < 0:
            raise ClusterError(f"bad file {str(name)[:80]!r} (size {size!r}) in a copy's listing")
        try:
            dest = inside(target, name, "file name in a copy's listing")
        except UnsafePathError as exc:
            raise ClusterError(f"bad file: {exc.message}") from None
        with create_new(dest) as f:
            left = size
            while left:
                n = read_into(buffer[:min(left, CHUNK)])
                if not n:
                    raise ClusterError(f"the copy's stream ended {size - left} bytes into {name} ({size} bytes)")
                f.write(buffer[:n])
                left -= n
    return sum(size for _, size in files)
