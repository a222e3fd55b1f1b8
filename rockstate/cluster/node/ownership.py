"""A node's gate to its partitions: ``control/ownership.py`` asked with the clock, and the wait for a frozen partition.

Every handler that serves a partition (data, moves, ingests, checkpoints)
asks here; the changes that can end a wait (unfreezing, releasing, a new
table, a thaw) go through here too, so the writers waiting are woken.
"""

from __future__ import annotations

import asyncio
import time

from ...control.ownership import Ownership, TableChange
from ...errors import PartitionUnavailableError
from ..table import Table

FREEZE_WAIT = 10.0  # longest a write waits for a frozen partition before the client retries


class Gate:
    def __init__(self) -> None:
        self.ownership = Ownership()
        self._changed = asyncio.Event()

    def check(self, pid: object, epoch: int, leased: bool = True) -> int:
        return self.ownership.check(pid, epoch, time.monotonic(), leased)

    async def writable(self, pids: list, epoch: int) -> list[int]:
        """The partitions, once none is frozen and all are ours at ``epoch``."""
        frozen = self.ownership.frozen
        for pid in pids if frozen else ():  # none frozen, the usual case: no look per partition
            deadline = time.monotonic() + FREEZE_WAIT
            while pid in frozen:
                try:
                    await asyncio.wait_for(self._changed.wait(), deadline - time.monotonic())
                except TimeoutError:
                    raise PartitionUnavailableError(f"partition {pid} is moving; retry", partition=pid) from None
        now = time.monotonic()
        return [self.ownership.check(pid, epoch, now) for pid in pids]

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # -- changes that end waits ------------------------------------------------------

    def apply_table(self, table: Table) -> TableChange | None:
        change = self.ownership.apply_table(table.epoch, table.owners, table.since)
        self._wake()
        return change

    def unfreeze(self, pid: object) -> None:
        self.ownership.unfreeze(pid)
        self._wake()

    def release(self, pid: object) -> bool:
        released = self.ownership.release(pid)
        self._wake()
        return released

    def thaw(self) -> list[int]:
        owned = self.ownership.thaw()
        self._wake()
        return owned
