"""Folders deleted off the caller's thread: those of a store's earlier layout (a RocksDB per partition), once
their partitions are imported (``Store.open_partition``).

Deleting a partition's files takes a few ms each, seconds for hundreds, and a node opens partitions on its
event loop. So a folder is only renamed into ``<store>/trash/`` (atomic, on the same file system) and one
background thread deletes it. A folder is therefore either in place or in the trash, whenever the process
dies; a store empties its trash when it opens.
"""

from __future__ import annotations

import itertools
import os
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor


class Trash:
    def __init__(self, store_path: str) -> None:
        self.path = os.path.join(store_path, "trash")
        os.makedirs(self.path, exist_ok=True)
        self._names = itertools.count()
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="rockstate-trash")
        self._last: Future | None = None
        for name in os.listdir(self.path):  # left by a process that died before deleting them
            self._last = self._worker.submit(shutil.rmtree, os.path.join(self.path, name), True)

    def discard(self, path: str) -> None:
        """Move ``path`` (if it exists) into the trash now, and delete it in the background."""
        target = os.path.join(self.path, f"{os.path.basename(path)}-{time.time_ns():x}-{next(self._names)}")
        try:
            os.rename(path, target)
        except FileNotFoundError:
            return
        self._last = self._worker.submit(shutil.rmtree, target, True)

    def wait(self) -> None:
        """Until everything discarded so far is deleted (one thread, in order: the last one ends last)."""
        if self._last is not None:
            self._last.result()

    def close(self) -> None:
        self._worker.shutdown(wait=True)
