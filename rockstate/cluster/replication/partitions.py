"""A node's replicated partitions: each partition's role taken from the table, and the parts that play it.

The path of one replicated write, by module:

1. ``primary.py`` (``Primaries``): ``Partition.write`` hands it each stored batch (``shipped``), under the
   partition's lock; it joins the partition's log, and the request's ``acknowledged`` wakes the senders of
   its backups. A data handler answers its client once ``acknowledged``.
2. ``sender.py`` (``Sender``, one per backup node): sends what ``Primaries.outgoing`` gives, one
   ``ReplicaApply`` at a time, and hands the answers to ``Primaries.answered``, which resolves the writes
   waiting.
3. ``backup.py`` (``Backups``), on each backup node: applies the batches in order.
4. ``copies.py`` (``ReplicaCopies``): a new or returning backup's copy, before it joins the stream.

Only the coordinator changes the in-sync set. A backup that cannot be reached, or has not applied a batch
sent ``replica_timeout`` ago, is reported ``unreachable``; the primary still waits for it until the
coordinator's next table (a newer replica epoch without it in sync) says otherwise. A backup that applied
everything sent is reported ``caught_up`` (``outcomes.py``: the answers and reports). An SST ingest, which is
no batch, makes the backups catch up anew (``Primaries.resync``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, Iterable

from ...rpc.async_client import AsyncChannel
from ...store import Store
from ..table import Table
from .backup import Backups
from .copies import ReplicaCopies
from .outcomes import Reports
from .primary import Primaries
from .sender import Sender

log = logging.getLogger(__name__)

KEPT_SHARE = 8


def kept_bytes(memory_bytes: int) -> int:
    """What the batches a node's replicas keep in memory (its primaries' logs, its backups' tails) may weigh: an
    eighth of its ``memory_bytes``, which RocksDB's block cache does not get, so the node's memory stays within
    ``memory_bytes`` with backups too. At P=1024 with TAIL batches a partition they weighed ~45 MiB on a node."""
    return memory_bytes // KEPT_SHARE


class NodeReplication:
    def __init__(self, store_of: Callable[[], Store], node_id: Callable[[], str | None], peer: Callable[[str], AsyncChannel],
                 report: Callable[[list], Awaitable[None]], owns: Callable[[int], bool],
                 retired: Callable[[int], Awaitable[None]], kept_bytes: int | None = None) -> None:
        """``peer(address)``: a kept connection to another node; ``report(reports)``: a ``ReplicaReport`` to the
        coordinator; ``owns(pid)``: served here; ``retired(pid)``: waits until a copy this node served is gone;
        ``kept_bytes``: what the batches the replicas keep in memory may weigh, half for the primaries' logs and
        half for the backups' tails."""
        self._store_of, self._node_id, self._peer, self._owns = store_of, node_id, peer, owns
        self.table = Table.empty(0)  # until the node's first: no partitions, the default replica timeout
        reports = Reports(report, self._replica_epoch, self.timeout)
        half = None if kept_bytes is None else kept_bytes // 2
        self.primaries = Primaries(store_of, reports.report, reports.again, self.timeout, half)
        self.backups = Backups(store_of, half)
        self.copies = ReplicaCopies(store_of, node_id, peer, owns, retired, self._replica_epoch, self.primaries, self.backups)
        self._senders: dict[str, tuple[Sender, asyncio.Task]] = {}
        self._me: str | None = None  # this node's id when the last table was applied
        self._unled: set[int] = set()  # the table names this node their primary, but it does not serve them
        self._stopping = False

    def timeout(self) -> float:
        return self.table.replica_timeout

    def _replica_epoch(self, pid: int) -> int:
        return self.table.replica_epoch(pid)

    def _address(self, node: str) -> str | None:
        return self.table.addresses.get(node)

    def apply_table(self, table: Table, opening: Iterable[int] = ()) -> None:
        """Take up each partition's role the table gives this node: primary, backup, or none (``opening``: partitions
        it is about to serve). Only the partitions whose row changed since the last table are looked at (a replica
        report bumps the epoch every few hundred ms: walking all P each time was 11 % of a node's put time at P=271),
        with the partitions it is about to serve and those whose serving changed without the table (released,
        thawed)."""
        self.primaries.on_loop()
        old, self.table, me = self.table, table, self._node_id()
        nodes: set[str] = set()
        for pid in sorted(self._changed(old, table, me, opening)):
            backups, epoch = table.backups_of(pid), table.replica_epoch(pid)
            self._unled.discard(pid)
            if table.owners[pid] == me and table.backup_count > 0:
                if self._owns(pid) or pid in opening:
                    self.primaries.lead(pid, epoch, backups, table.in_sync_of(pid), table.replication, self.backups.promoted)
                    nodes.update(backups)
                    continue
                self._unled.add(pid)  # named but not served (yet, or released): looked at again with every table
            if self.primaries.serves(pid):
                self.primaries.step_down(pid)
            if me in backups:
                self.backups.configure(pid, epoch, sole=len(backups) == 1)
            else:
                self.drop_backup(pid)
        self._me = me
        for node in nodes - set(self._senders) if not self._stopping else ():
            sender = Sender(node, self.primaries, self._peer, self._address, self.timeout)
            self._senders[node] = (sender, asyncio.ensure_future(sender.run()))

    def _changed(self, old: Table, new: Table, me: str | None, opening: Iterable[int]) -> set[int]:
        """The partitions whose role may have changed from ``old`` to ``new``: all of them when what applies to every
        partition changed (this node's id, the partition count, backup_count, the replication mode)."""
        if (me != self._me or old.partitions != new.partitions or old.backup_count != new.backup_count
                or old.replication != new.replication):
            return set(range(new.partitions))
        changed = {*opening, *self._unled}
        for a, b in ((old.owners, new.owners), (old.backups, new.backups), (old.in_sync, new.in_sync),
                     (old.replica_epochs, new.replica_epochs)):
            if a != b:  # one comparison in C when this part of the table is unchanged
                changed.update(range(new.partitions) if len(a) != len(b) else
                               [pid for pid, (x, y) in enumerate(zip(a, b)) if x != y])
        changed.update(pid for pid in self.primaries.pids() if not self._owns(pid))  # released since
        return changed

    def drop_backup(self, pid: int) -> None:
        """No backup copy of ``pid`` here any more (a catch-up running is cancelled)."""
        held, copying = self.backups.forget(pid), self.copies.cancel(pid)
        if (held or copying) and not self._owns(pid):
            self._store_of().close_partition(pid, drop=True)

    async def stop(self) -> None:
        self._stopping = True
        for sender, _ in self._senders.values():
            sender.stop()
        self.primaries.stop()
        tasks = [*(task for _, task in self._senders.values()), *self.copies.running()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
