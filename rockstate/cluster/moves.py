"""Moving a partition between nodes, in two phases, so writes wait only for the last delta.

Phase 1, the source keeps serving. The target asks the source for a copy:
the source takes a hard-link RocksDB checkpoint of the partition under its
write lock and, from that instant, records every write to the partition.
The target fetches the copy's files in chunks into ``<store>/incoming/``,
opens the copy (not serving it), and catches up with the writes recorded
while it fetched.

Phase 2, the partition is frozen on the source (writes wait; the coordinator
does this). The target takes the writes recorded since its catch-up — a
small delta — and applies them. The coordinator then bumps the table epoch:
the target serves, the source drops its copy, and the writes that waited
are refused there (NOT_OWNER) and retried at the target. Writes wait only
for the last delta, however large the partition.

Transitions, on the source: SERVING --copy--> RECORDING --catch-up delta-->
RECORDING --freeze--> FROZEN --last delta--> HANDED_OVER --new table-->
dropped. Any failure before the new table: the coordinator unfreezes the
source, which discards the copy and the recording and serves on.
"""

from __future__ import annotations

import os
import shutil

from ..store import Store
from ..store.store import partition_dir

CHUNK = 4 << 20


class MoveSource:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.root = os.path.join(store.path, "outgoing")

    def _dir(self, pid: int) -> str:
        return os.path.join(self.root, partition_dir(pid))

    def copy(self, pid: int) -> list[list]:
        """Take the copy and start recording; answers [[file name, size], ...] (blocking)."""
        target = self._dir(pid)
        shutil.rmtree(target, ignore_errors=True)
        os.makedirs(self.root, exist_ok=True)
        self.store.partition(pid).hard_link_copy(target, record=True)
        return [[name, os.path.getsize(os.path.join(target, name))] for name in sorted(os.listdir(target))]

    def chunk(self, pid: int, name: str, offset: int, length: int) -> bytes:
        if os.sep in name or name.startswith("."):
            raise ValueError(f"bad file name {name!r}")
        with open(os.path.join(self._dir(pid), name), "rb") as f:
            f.seek(offset)
            return f.read(min(length, CHUNK))

    def delta(self, pid: int, final: bool) -> list:
        """The writes since the copy or the last delta; ``final``: the partition is frozen, recording ends."""
        return self.store.partition(pid).take_recorded(stop=final)

    def discard(self, pid: int) -> None:
        shutil.rmtree(self._dir(pid), ignore_errors=True)
        try:
            self.store.partition(pid).take_recorded()
        except Exception:  # noqa: BLE001 -- the partition is gone already: nothing is recording
            pass


class MoveTarget:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.root = os.path.join(store.path, "incoming")

    def dir(self, pid: int) -> str:
        return os.path.join(self.root, partition_dir(pid))

    def start(self, pid: int) -> str:
        target = self.dir(pid)
        shutil.rmtree(target, ignore_errors=True)
        os.makedirs(target)
        return target

    def install(self, pid: int) -> None:
        """The fetched copy becomes the (not yet served) partition (blocking)."""
        self.store.close_partition(pid, drop=True)
        os.replace(self.dir(pid), self.store.partition_path(pid))
        self.store.open_partition(pid)

    def apply(self, pid: int, delta: list) -> None:
        if delta:
            self.store.partition(pid).write(delta)

    def discard(self, pid: int) -> None:
        shutil.rmtree(self.dir(pid), ignore_errors=True)
