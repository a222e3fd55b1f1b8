"""Partition directories deleted off the caller's thread.

Dropping a partition closes its RocksDB (waiting for its background work) and
deletes its files: a few ms each, seconds for the hundreds a node drops when a
table takes its backups away, and a node drops them on its event loop. So a drop
only renames the directory into ``<store>/trash/`` (atomic, on the same file
system) and hands the close and the deletion to one background thread. A
partition's directory is therefore either in place or in the trash, whenever the
process dies; a store empties its trash when it opens.
"""

from __future__ import annotations

import itertools
import os
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable


class Trash:
    def __init__(self, store_path: str) -> None:
        self.path = os.path.join(store_path, "trash")
        os.makedirs(self.path, exist_ok=True)
        self._names = itertools.count()
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="rockstate-trash")
        self._last: Future | None = None
        for name in os.listdir(self.path):  # left by a process that died before deleting them
            self._last = self._worker.submit(shutil.rmtree, os.path.join(self.path, name), True)

    def discard(self, path: str, close: Callable[[], None] | None = None) -> Future:
        """Move ``path`` (if it exists) into the trash now; then, in the background, ``close`` (the RocksDB that
        had it open) and delete it. The answer is done once ``close`` has run (its error, if any)."""
        target = os.path.join(self.path, f"{os.path.basename(path)}-{time.time_ns():x}-{next(self._names)}")
        try:
            os.rename(path, target)
        except FileNotFoundError:
            target = ""
        closed = self._worker.submit(close or (lambda: None))
        self._last = self._worker.submit(shutil.rmtree, target, True) if target else closed
        return closed

    def wait(self) -> None:
        """Until everything discarded so far is closed and deleted (one thread, in order: the last one ends last)."""
        if self._last is not None:
            self._last.result()

    def close(self) -> None:
        self._worker.shutdown(wait=True)
