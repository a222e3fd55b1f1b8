"""A node's side of replicated partitions: the primary's stream to its backups, the backups' side, catch-up.

The primary. Every write to a partition it is primary of goes through
``Partition.write``, which stores the batch with its sequence number and
hands it, as stored, to ``shipped`` under the partition's lock: the batch
joins the partition's log in the order it was applied, whatever made it (a
client's write or compare-and-set, a staged batch, a commit, a request id, a
TTL deletion; an SST ingest, which is no batch, makes the backups catch up
anew: ``resync``). One sender per backup node sends what the logs of the
partitions it backs hold past what it applied (``replica_send.py``), one ``ReplicaApply`` at a time
(batches queued meanwhile, of every partition, ride together), and feeds the
answers to each partition's ``PrimaryAcks`` (``control/write_acks.py``). A data
handler answers its client only once ``acknowledged``: every backup the
primary waits for applied the partition's batches so far (``sync``; ``async``
answers at once). Reads wait the same way, so nothing read can be lost.

Only the coordinator changes the in-sync set. A backup that cannot be reached,
or has not applied a batch sent ``replica_timeout`` ago, is reported
``unreachable``; the primary still waits for it until the coordinator's next
table (a newer replica epoch without it in sync) says otherwise. A backup that
applied everything sent is reported ``caught_up``.

A backup applies its primary's batches in order (``replica_apply.py``). A new or returning backup catches up by a hard-link copy
and the batches after it (``replica_copies.py``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from typing import Awaitable, Callable

from ...control.write_acks import BackupApply, PrimaryAcks
from ...errors import PartitionUnavailableError, RockstateError
from ...rpc.async_client import AsyncChannel
from ...store import Store
from ...ops import RAW_PUT
from ...store.partition import REPLICATION
from .. import protocol as p
from .backup import BackupSide
from .sender import PrimarySender
from .copies import ReplicaCopies
from ..table import Table

log = logging.getLogger(__name__)



def _under_lock(part, action) -> None:
    with part.lock:
        action()


class NodeReplication(BackupSide, PrimarySender):
    def __init__(self, store_of: Callable[[], Store], node_id: Callable[[], str], peer: Callable[[str], AsyncChannel],
                 report: Callable[[list], Awaitable[None]], owns: Callable[[int], bool],
                 retired: Callable[[int], Awaitable[None]]) -> None:
        self._store_of, self.node_id, self.peer, self._report_to, self.owns = store_of, node_id, peer, report, owns
        self.retired = retired  # waits until a copy this node served is gone
        self.table: Table | None = None
        self.acks: dict[int, PrimaryAcks] = {}  # partitions this node is primary of
        self.applies: dict[int, BackupApply] = {}  # partitions this node holds a caught-up backup copy of
        self.logs: dict[int, deque] = {}  # pid -> (seq, stored ops), oldest first
        self.shipped_to: dict[int, int] = {}  # pid -> the last batch in its log
        self.sent: dict[tuple[str, int], int] = {}  # (backup, pid) -> its position as the primary knows it
        self._waiters: dict[int, list[tuple[int, asyncio.Future]]] = {}
        self._wake: dict[str, asyncio.Event] = {}
        self._dirty: dict[str, set[int]] = {}  # backup -> partitions with batches for it since its last send
        self._senders: dict[str, asyncio.Task] = {}
        self._reported: dict[tuple[int, str, str], float] = {}
        self.catching_up: dict[int, asyncio.Task] = {}  # pid -> its catch-up (replica_copies.py)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._stopping = False
        self.copies = ReplicaCopies(self)  # a new backup's catch-up
        self.handlers = {p.ReplicaApply: self.apply, p.ReplicaPositions: self.positions, **self.copies.handlers}

    @property
    def store(self) -> Store:
        return self._store_of()

    def timeout(self) -> float:
        return self.table.replica_timeout if self.table is not None else 1.0

    # -- roles, from the table -------------------------------------------------------

    def apply_table(self, table: Table, opening=()) -> None:
        """Take up each partition's role the table gives this node: primary, backup, or none (``opening``: partitions
        it is about to serve)."""
        self._loop, self._loop_thread = asyncio.get_running_loop(), threading.get_ident()
        self.table, me = table, self.node_id()
        for pid in range(table.partitions):
            backups, epoch = table.backups_of(pid), table.replica_epoch(pid)
            if table.owners[pid] == me and table.backup_count > 0 and (self.owns(pid) or pid in opening):
                self._be_primary(pid, epoch, backups, table.in_sync_of(pid))
                continue
            if pid in self.acks:
                self._stop_primary(pid)
            if me in backups and pid in self.applies:
                self.applies[pid].configure(epoch)
            elif me not in backups:
                self.drop_backup(pid)
        for node in {b for pid in self.acks for b in table.backups_of(pid)} - set(self._senders) if not self._stopping else ():
            self._wake[node] = asyncio.Event()
            self._senders[node] = asyncio.ensure_future(self._send_loop(node))

    def _be_primary(self, pid: int, epoch: int, backups: tuple, in_sync: tuple) -> None:
        acks = self.acks.get(pid)
        if acks is None:  # new, or promoted from backup
            part = self.store.partition(pid)
            part.backup, seq = False, part.seq()
            # only a backup's tail is this copy's history (a copy moved or restored in has another node's)
            tail = [e for e in self.logs.get(pid, ()) if e[0] <= seq] if self.applies.pop(pid, None) else []
            self.acks[pid] = PrimaryAcks(epoch - 1, dict.fromkeys(in_sync, seq), seq, self.table.replication)
            self.acks[pid].configure(epoch, backups, in_sync)  # the backups catching up too
            for b in in_sync:
                self.sent[b, pid] = seq  # a backup behind answers with its position
            self.logs[pid] = deque(tail)  # unbounded from now on
            self.shipped_to[pid] = seq
            part.shipper = self.shipped
            log.info("primary of partition %d at batch %d, replica epoch %d, backups %s", pid, seq, epoch, list(backups))
        else:
            self._resolve(pid, acks.configure(epoch, backups, in_sync))
        for b in backups:
            if b in self._wake:
                self._wake[b].set()

    def _stop_primary(self, pid: int) -> None:
        del self.acks[pid]
        try:
            self.store.partition(pid).shipper = None
        except RockstateError:
            pass
        self._forget(pid)
        for _, fut in self._waiters.pop(pid, []):
            if not fut.done():
                fut.set_exception(PartitionUnavailableError(f"partition {pid} has a new primary; retry", partition=pid))

    def drop_backup(self, pid: int) -> None:
        if pid in self.applies or pid in self.catching_up:
            self._drop_backup(pid)

    def _forget(self, pid: int) -> None:
        """The partition's log and positions: another history than the copy this node may hold of it next."""
        self.logs.pop(pid, None)
        self.shipped_to.pop(pid, None)
        for key in [k for k in self.sent if k[1] == pid]:
            del self.sent[key]

    def _drop_backup(self, pid: int) -> None:
        self.applies.pop(pid, None)
        self.logs.pop(pid, None)
        task = self.catching_up.pop(pid, None)
        if task is not None:
            task.cancel()
        if not self.owns(pid):
            self.store.close_partition(pid, drop=True)

    def diverged(self, pid: int) -> None:
        """The primary's copy was replaced (a restore): its backups no longer hold a prefix of it; they catch up anew."""
        acks = self.acks.pop(pid, None)
        if acks is None:
            return
        part = self.store.partition(pid)
        seq = part.seq()
        self.acks[pid] = PrimaryAcks(acks.epoch - 1, dict.fromkeys(acks.in_sync, 0), seq, self.table.replication)
        self.acks[pid].configure(acks.epoch, self.table.backups_of(pid), acks.in_sync)  # waits until the coordinator drops them
        self.logs[pid], self.shipped_to[pid] = deque(), seq
        for b in self.table.backups_of(pid):
            self.sent.pop((b, pid), None)
            self._reported.pop((pid, b, "diverged"), None)
            self._report(pid, b, "diverged")

    async def resync(self, pid: int) -> None:
        """The primary's copy changed outside its batches (an SST ingest): its backups catch up anew, and this
        returns once the coordinator no longer counts them in sync (or they caught up)."""
        if pid not in self.acks:
            return
        self.diverged(pid)
        self.store.partition(pid).write([(RAW_PUT, REPLICATION, b"resync", b"")])  # a batch only a new copy holds
        await self.acknowledged([pid])

    # -- the primary ---------------------------------------------------------------

    def shipped(self, pid: int, seq: int, stored: list) -> None:
        """From ``Partition.write``, under the partition's lock (on any thread)."""
        entries = self.logs.get(pid)
        if entries is None:
            return  # it stopped being the primary as this write went through
        entries.append((seq, stored))
        self.shipped_to[pid] = seq
        if threading.get_ident() == self._loop_thread:
            self._sent(pid)
        else:
            self._loop.call_soon_threadsafe(self._sent, pid)

    def _sent(self, pid: int) -> None:
        acks = self.acks.get(pid)
        if acks is None:
            return
        now = time.monotonic()
        while acks.last_sent < self.shipped_to[pid]:
            acks.send(now)
        self._resolve(pid, [])  # async: acknowledged when sent
        for b in self.table.backups_of(pid):
            if b in self._wake:
                self._dirty.setdefault(b, set()).add(pid)
                self._wake[b].set()

    async def acknowledged(self, pids) -> None:
        """Once every backup the primary waits for applied the batches of ``pids`` so far."""
        for pid in pids:
            acks = self.acks.get(pid)
            if acks is None:
                continue
            self._sent(pid)
            seq = self.shipped_to[pid]
            if acks.acked >= seq:
                continue
            fut = asyncio.get_running_loop().create_future()
            self._waiters.setdefault(pid, []).append((seq, fut))
            try:
                await asyncio.wait_for(fut, 4 * self.timeout() + 5.0)
            except TimeoutError:
                raise PartitionUnavailableError(
                    f"partition {pid}'s backups have not applied its batch {seq}; retry", partition=pid) from None

    def _resolve(self, pid: int, newly: list) -> None:
        acks, waiting = self.acks.get(pid), self._waiters.get(pid)
        if acks is None or not waiting:
            return
        keep = []
        for seq, fut in waiting:
            if fut.done():
                continue
            if acks.acked >= seq:
                fut.set_result(None)
            else:
                keep.append((seq, fut))
        self._waiters[pid] = keep

    def _report(self, pid: int, node: str, kind: str) -> None:
        """Tell the coordinator, at most once per replica timeout for the same thing."""
        key, now = (pid, node, kind), time.monotonic()
        if now - self._reported.get(key, -1e9) < self.timeout():
            return
        self._reported[key] = now
        epoch = self.table.replica_epoch(pid)
        log.debug("report %s %s of partition %d at epoch %d", node, kind, pid, epoch)
        asyncio.ensure_future(self._send_report([[pid, node, epoch, kind]]))

    async def _send_report(self, reports: list) -> None:
        try:
            await self._report_to(reports)
        except RockstateError as e:
            log.warning("could not report %s to the coordinator: %s", reports, e)

    async def drained(self, pid: int) -> int:
        """A frozen partition handed to a backup: its own sweeps stop (they write); answers its last batch once every
        backup it waits for applied it."""
        if pid not in self.acks:
            raise PartitionUnavailableError(f"this node is not partition {pid}'s primary", partition=pid)
        part = self.store.partition(pid)
        await asyncio.to_thread(_under_lock, part, lambda: setattr(part, "backup", True))  # a sweep's write ends first
        await self.acknowledged([pid])
        return part.seq()

    def resumed(self, pid: int) -> None:
        """A drain undone: the primary's sweeps go on."""
        if pid in self.acks:
            self.store.partition(pid).backup = False

    async def stop(self) -> None:
        self._stopping = True
        for wake in self._wake.values():
            wake.set()
        for pid in list(self.acks):
            self._stop_primary(pid)
        for task in [*self._senders.values(), *self.catching_up.values()]:
            task.cancel()
        await asyncio.gather(*self._senders.values(), *self.catching_up.values(), return_exceptions=True)
