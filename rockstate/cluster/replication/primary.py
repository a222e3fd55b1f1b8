"""The primary's side of its replicated partitions: their logs, what each backup applied, and the writes waiting on it.

Every write to a partition this node is primary of goes through
``Partition.write``, which stores the batch with its sequence number and hands
its ops, as stored, to ``shipped`` under the partition's lock (the number goes
beside them: a backup stores its own): the batch joins the
partition's log in the order it was applied, whatever made it (a client's
write or compare-and-set, a staged batch, a commit, a request id, a TTL
deletion). A request's ``acknowledged`` (or the loop's next turn, for a write
nobody waits on) queues the partitions shipped for their backups' senders
(``sender.py``) and wakes each once; a sender asks ``outgoing`` for what the
logs hold past the backup's position and hands its answers to ``answered``;
those feed each partition's ``PrimaryAcks``
(``control/write_acks.py``). A data handler answers its client only once
``acknowledged``: every backup the primary waits for applied the partition's
batches so far (``sync``; ``async`` answers at once). Reads wait the same way,
so nothing read can be lost.

``Primaries`` is the one owner of this state; the sender, the copies and the
node call it by the methods below.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from typing import Callable, Iterable, NamedTuple

from ...control.write_acks import PrimaryAcks
from ...errors import PartitionUnavailableError, RockstateError
from ...ops import RAW_PUT
from ...store import Store
from ...store.partition import REPLICATION, Partition
from ...store.writes import stored_bytes
from .backup import TAIL, Kept
from .outcomes import Applied, Report
from .runs import Runs
from .waits import Wait

log = logging.getLogger(__name__)

MAX_LOG = 200_000  # batches a primary keeps for a backup behind; one further behind catches up anew
MAX_ITEMS_BYTES = 8 << 20  # per ReplicaApply, roughly
MAX_ITEMS = 2000  # batches per ReplicaApply


class Outgoing(NamedTuple):
    items: list  # [[pid, replica epoch, seq, stored ops or None (a probe)], ...]
    carried: dict[int, int]  # pid -> the log's end it carries, for the partitions it carries whole
    runs: list  # ``ReplicaApply.runs``: batch puts' pieces, applied after the items


def _under_lock(part: Partition, action: Callable[[], None]) -> None:
    with part.lock:
        action()


class Primaries:
    def __init__(self, store_of: Callable[[], Store], report: Callable[[int, str, Report], None],
                 again: Callable[[int, str, Report], None], timeout: Callable[[], float], kept_bytes: int | None = None) -> None:
        """``report(pid, backup, kind)`` tells the coordinator (at most once a replica timeout; ``again``: now);
        ``timeout()``: the table's replica timeout; ``kept_bytes``: what the logs' batches every backup applied may
        weigh in all (``stored_bytes``; None: TAIL a log), shared evenly by the partitions led."""
        self._store_of, self._report, self._again, self._timeout = store_of, report, again, timeout
        self._kept_bytes = kept_bytes
        # what each log weighs: added by ``shipped`` (under the partition's lock, on any thread), trimmed on the loop,
        # each counter with one writer
        self._log_added: dict[int, int] = {}
        self._log_trimmed: dict[int, int] = {}
        self._acks: dict[int, PrimaryAcks] = {}
        self._backups: dict[int, tuple[str, ...]] = {}  # pid -> its backups in the newest table
        self._mode = "sync"  # the table's replication
        self._logs: dict[int, deque[Kept]] = {}  # pid -> its batches, oldest first
        self._shipped_to: dict[int, int] = {}  # pid -> the last batch in its log
        self._sent: dict[tuple[str, int], int] = {}  # (backup, pid) -> its position as the primary knows it
        self._waiters: dict[int, list[tuple[int, Wait]]] = {}  # pid -> (seq, the request waiting for it)
        self._wake: dict[str, asyncio.Event] = {}  # backup node -> its sender's
        self._dirty: dict[str, set[int]] = {}  # backup node -> partitions with batches for it since its last send
        self._unqueued: list[int] = []  # partitions shipped on the loop, queued for their senders once per request
        self._loop: asyncio.AbstractEventLoop | None = None  # the node's, where ``shipped`` posts from other threads
        self._loop_thread = 0

    def serves(self, pid: int, backup: str | None = None) -> bool:
        """Whether this node is ``pid``'s primary (with ``backup`` among its backups)."""
        return pid in self._acks and (backup is None or backup in self._backups[pid])

    def pids(self) -> list[int]:
        return list(self._acks)

    def sender(self, node: str) -> asyncio.Event:
        """The event that wakes ``node``'s sender, made once per node."""
        return self._wake.setdefault(node, asyncio.Event())

    def on_loop(self) -> None:
        """On the node's loop, before any partition is shipped: the loop ``shipped`` posts to from other threads."""
        self._loop, self._loop_thread = asyncio.get_running_loop(), threading.get_ident()

    # -- roles ------------------------------------------------------------------------

    def lead(self, pid: int, epoch: int, backups: tuple[str, ...], in_sync: tuple[str, ...], mode: str,
             tail_of: Callable[[int, int], list[Kept]]) -> None:
        """Be (or stay) ``pid``'s primary at replica ``epoch``; new, its log starts from ``tail_of(pid, seq)``: a
        promoted backup's tail, through the copy's last batch ``seq``."""
        self._backups[pid], self._mode = backups, mode
        acks = self._acks.get(pid)
        if acks is None:  # new, or promoted from backup
            part = self._store_of().partition(pid)
            part.backup, seq = False, part.seq()
            tail = tail_of(pid, seq)
            self._acks[pid] = acks = PrimaryAcks(epoch - 1, dict.fromkeys(in_sync, seq), seq, mode)
            acks.configure(epoch, backups, in_sync)  # the backups catching up too
            for b in in_sync:
                self._sent[b, pid] = seq  # a backup behind answers with its position
            self._logs[pid] = deque(tail)  # trimmed by _trim from now on
            self._log_added[pid], self._log_trimmed[pid] = sum(e[2] for e in tail), 0
            self._shipped_to[pid] = seq
            part.shipper = self.shipped
            log.debug("primary of partition %d at batch %d, replica epoch %d, backups %s", pid, seq, epoch, list(backups))
        else:
            acks.configure(epoch, backups, in_sync)
            self._resolve(pid)
        for b in backups:
            if b in self._wake:
                self._wake[b].set()

    def step_down(self, pid: int) -> None:
        """No longer ``pid``'s primary: its log and positions go (another history than a copy held next), its
        waiting writes fail."""
        del self._acks[pid]
        self._backups.pop(pid, None)
        try:
            self._store_of().partition(pid).shipper = None
        except RockstateError:
            pass
        self._logs.pop(pid, None)
        self._log_added.pop(pid, None)
        self._log_trimmed.pop(pid, None)
        self._shipped_to.pop(pid, None)
        for key in [k for k in self._sent if k[1] == pid]:
            del self._sent[key]
        for _, wait in self._waiters.pop(pid, []):
            wait.failed(PartitionUnavailableError(f"partition {pid} has a new primary; retry", partition=pid))

    def diverged(self, pid: int) -> None:
        """The primary's copy was replaced (a restore): its backups no longer hold a prefix of it; they catch up anew."""
        acks = self._acks.pop(pid, None)
        if acks is None:
            return
        seq = self._store_of().partition(pid).seq()
        backups = self._backups[pid]
        self._acks[pid] = PrimaryAcks(acks.epoch - 1, dict.fromkeys(acks.in_sync, 0), seq, self._mode)
        self._acks[pid].configure(acks.epoch, backups, acks.in_sync)  # waits until the coordinator drops them
        self._logs[pid], self._shipped_to[pid] = deque(), seq
        self._log_added[pid] = self._log_trimmed[pid] = 0
        for b in backups:
            self._sent.pop((b, pid), None)
            self._again(pid, b, Report.DIVERGED)

    async def resync(self, pid: int) -> None:
        """The primary's copy changed outside its batches (an SST ingest): its backups catch up anew, and this
        returns once the coordinator no longer counts them in sync (or they caught up)."""
        if pid not in self._acks:
            return
        self.diverged(pid)
        self._store_of().partition(pid).write([(RAW_PUT, REPLICATION, b"resync", b"")])  # a batch only a new copy holds
        await self.acknowledged([pid])

    async def drained(self, pid: int) -> int:
        """A frozen partition handed to a backup: its own sweeps stop (they write); answers its last batch once every
        backup it waits for applied it."""
        if pid not in self._acks:
            raise PartitionUnavailableError(f"this node is not partition {pid}'s primary", partition=pid)
        part = self._store_of().partition(pid)
        await asyncio.to_thread(_under_lock, part, lambda: setattr(part, "backup", True))  # a sweep's write ends first
        await self.acknowledged([pid])
        return part.seq()

    def resumed(self, pid: int) -> None:
        """A drain undone: the primary's sweeps go on."""
        if pid in self._acks:
            self._store_of().partition(pid).backup = False

    def stop(self) -> None:
        for wake in self._wake.values():
            wake.set()
        for pid in list(self._acks):
            self.step_down(pid)

    # -- the write path ------------------------------------------------------------------

    def shipped(self, pid: int, seq: int, stored: list, size: int | None = None) -> None:
        """``Partition.shipper``: from ``Partition.write``, under the partition's lock (on any thread); ``size``: the
        batch's ``stored_bytes``, when the caller knows it."""
        entries = self._logs.get(pid)
        if entries is None:
            return  # it stopped being the primary as this write went through
        if size is None:
            size = stored_bytes(stored)
        entries.append((seq, stored, size))
        self._log_added[pid] = self._log_added.get(pid, 0) + size  # get: a step-down may have just dropped it
        self._shipped_to[pid] = seq
        assert self._loop is not None  # set (on_loop) before any partition gets this shipper
        if threading.get_ident() == self._loop_thread:
            if not self._unqueued:  # queued by the request's ``acknowledged``, or at the loop's next turn (a sweep's)
                self._loop.call_soon(self._queue)
            self._unqueued.append(pid)
        else:
            self._loop.call_soon_threadsafe(self._queued, [pid])

    def _queue(self) -> None:
        pids, self._unqueued = self._unqueued, []
        if pids:
            self._queued(pids)

    def _queued(self, pids: list[int]) -> None:
        """The logs' new batches counted sent, and the senders of the partitions' backups woken: once for a
        request's partitions (per partition it was 3 % of a node's CPU under P=271 puts)."""
        now, woken = time.monotonic(), set()
        for pid in pids:
            acks = self._acks.get(pid)
            if acks is None:
                continue
            acked = acks.acked
            acks.sent_through(self._shipped_to[pid], now)
            if acks.acked != acked:  # async, or none to wait for: acknowledged when sent
                self._resolve(pid)
            for b in self._backups[pid]:
                if b in self._wake:
                    self._dirty.setdefault(b, set()).add(pid)
                    woken.add(b)
        for b in woken:
            self._wake[b].set()

    async def acknowledged(self, pids: Iterable[int]) -> None:
        """Once every backup the primary waits for applied the batches of ``pids`` so far: one wait for the request,
        whatever the number of its partitions (a future and a timer each cost a loop round per partition)."""
        self._queue()
        wait: Wait | None = None
        for pid in pids:
            acks = self._acks.get(pid)
            if acks is None:
                continue
            seq = self._shipped_to[pid]
            if acks.last_sent < seq:  # shipped from another thread, not yet queued on the loop
                self._queued([pid])
            if acks.acked >= seq:
                continue
            if wait is None:
                wait = Wait(asyncio.get_running_loop().create_future())
            wait.remaining += 1
            self._waiters.setdefault(pid, []).append((seq, wait))
        if wait is None:
            return
        # a timer on the future, not asyncio.timeout (an inline request's first step runs outside any task,
        # rpc/serving.py) nor wait_for (a future, a callback and a timer more per write)
        expiry = wait.done.get_loop().call_later(4 * self._timeout() + 5.0, wait.expire)
        try:
            await wait.done
        except TimeoutError:
            pid, seq = next(((pid, seq) for pid, waiting in self._waiters.items() for seq, w in waiting if w is wait), (-1, 0))
            raise PartitionUnavailableError(
                f"partition {pid}'s backups have not applied its batch {seq}; retry", partition=pid) from None
        finally:
            expiry.cancel()
            wait.cancel()

    def _resolve(self, pid: int) -> None:
        """The waits that the batches of ``pid`` acknowledged so far end (one count each)."""
        acks, waiting = self._acks.get(pid), self._waiters.get(pid)
        if acks is None or not waiting:
            return
        if waiting[-1][0] <= acks.acked:  # every one (they wait in the order of their batches): the steady stream's case
            del self._waiters[pid]
            for _, wait in waiting:
                if not wait.done.done():
                    wait.one_acknowledged()
            return
        keep = []
        for seq, wait in waiting:
            if wait.done.done():
                continue
            if acks.acked >= seq:
                wait.one_acknowledged()
            else:
                keep.append((seq, wait))
        self._waiters[pid] = keep

    # -- a backup's copy (copies.py) ---------------------------------------------------------

    def copied(self, node: str, pid: int, seq: int) -> None:
        """Under the write lock, as a copy for backup ``node`` is taken at batch ``seq``: the batches after it are
        the ones shipped to it."""
        self._sent[node, pid] = seq

    # -- for a backup node's sender (sender.py) -------------------------------------------------

    def pending(self, node: str) -> bool:
        return bool(self._dirty.get(node))

    def outgoing(self, node: str, full: bool, probe_in_sync: bool = True, runs: bool = True) -> Outgoing:
        """What to send ``node`` next: the batches past its position of the partitions written since its last send;
        ``full``: of all it backs, with reports of its lags and probes of idle copies (of in-sync ones only with
        ``probe_in_sync``), and the logs trimmed; ``runs``: batch puts' pieces as runs (not to a node of an earlier
        version)."""
        self._queue()
        now, size, pieces = time.monotonic(), 0, 0
        items: list[list] = []
        carried: dict[int, int] = {}
        grouped = Runs() if runs else None
        dirty = self._dirty.pop(node, set())
        acks_of, backups_of, sent_at, shipped_to, logs = self._acks, self._backups, self._sent, self._shipped_to, self._logs
        pids = [pid for pid in (acks_of if full else dirty) if pid in acks_of and node in backups_of[pid]]
        for pid in pids:
            acks = acks_of[pid]
            start = sent_at.get((node, pid))
            if full:
                if node in acks.overdue(now, self._timeout()):
                    self._report(pid, node, Report.UNREACHABLE)
                    self._resolve(pid)  # a late joining backup is waited for no more
                if node in acks.reported:  # until the coordinator's table has it in sync (a report may have crossed a change)
                    self._report(pid, node, Report.CAUGHT_UP)
                if start is None and node in acks.in_sync:
                    self._report(pid, node, Report.DIVERGED)  # its copy is not this primary's any more (a restore, an ingest)
            if start is None:
                continue
            idle = shipped_to[pid] <= start  # nothing past its position (most of a full look's partitions)
            if not idle and (size > MAX_ITEMS_BYTES or pieces >= MAX_ITEMS):
                self._dirty.setdefault(node, set()).add(pid)  # the rest next time
                continue
            entries: list[Kept] | None
            if idle:
                entries = []
            else:  # the steady stream's case first: the log's newest batch alone is past the backup's position
                batches = logs[pid]
                entries = [batches[-1]] if batches and batches[-1][0] == start + 1 else self._log_after(pid, start)
            if entries is None:
                self._report(pid, node, Report.UNREACHABLE)  # too far behind: it catches up anew
                continue
            weight = (entries[0][2] if len(entries) == 1 else sum([e[2] for e in entries])) if entries else 0
            if entries and len(entries) <= MAX_ITEMS - pieces and size + weight <= MAX_ITEMS_BYTES \
                    and grouped is not None and grouped.add(pid, acks.epoch, entries):  # else as items, the message's bounds kept
                pieces, size = pieces + len(entries), size + weight
                carried[pid] = entries[-1][0]  # the whole log past its position, in runs
                continue
            for seq, stored, weight in entries:
                if pieces and (size > MAX_ITEMS_BYTES or pieces >= MAX_ITEMS):
                    self._dirty.setdefault(node, set()).add(pid)  # the rest next time (a backup applies a partition's batches in order)
                    break
                items.append([pid, acks.epoch, seq, stored])
                pieces += 1
                size += weight
            else:  # the whole log past its position: applying it, the backup is one request behind at most
                carried[pid] = entries[-1][0] if entries else start
            # a probe: is its copy open, is it caught up? A joining copy is found caught up by one, at every look; an
            # idle in-sync one's node may have restarted (nothing else would find out), looked at less often
            if full and not entries and (probe_in_sync or node not in acks.in_sync):
                items.append([pid, acks.epoch, 0, None])
        if full:
            self._trim(pids)
        return Outgoing(items, carried, [] if grouped is None else grouped.wire())

    def resend(self, node: str, pids: Iterable[int]) -> None:
        """``node`` got none of these partitions' batches of the last send (it refused its form): sent again next."""
        self._dirty.setdefault(node, set()).update(pid for pid in pids if pid in self._acks)
        if node in self._wake:
            self._wake[node].set()

    def unreachable(self, node: str, pids: Iterable[int]) -> None:
        for pid in pids:
            self._report(pid, node, Report.UNREACHABLE)

    def answered(self, node: str, replies: list, carried: dict[int, int]) -> None:
        """``node``'s answers to a ``ReplicaApply``: [[pid, last applied, status], ...]."""
        acks_of, sent, shipped_to, waiters = self._acks, self._sent, self._shipped_to, self._waiters
        logs, backups_of, trimmed_of = self._logs, self._backups, self._log_trimmed
        not_ready, ok = Applied.NOT_READY, Applied.OK  # an enum's member looked up once, not per partition
        for pid, applied, status in replies:
            acks = acks_of.get(pid)
            if acks is None:
                continue
            if status == not_ready:  # it holds no open copy (a restarted node): no stream brings it back, a copy does
                self._report(pid, node, Report.DIVERGED)
                continue
            sent[node, pid] = applied  # behind: resent from there
            if applied < shipped_to.get(pid, 0):
                self._dirty.setdefault(node, set()).add(pid)
            entries, backups = logs[pid], backups_of[pid]
            if entries and entries[0][0] <= applied and len(backups) == 1 and backups[0] == node:  # its only backup
                # (not one just dropped, whose successor may be behind), whose answered position never goes back
                trimmed = trimmed_of[pid]
                while entries and entries[0][0] <= applied:
                    trimmed += entries.popleft()[2]
                trimmed_of[pid] = trimmed
            if acks.applied(node, applied) and waiters.get(pid):  # only a newly acknowledged batch ends a wait
                self._resolve(pid)
            if node in acks.in_sync:
                continue
            if status == ok and acks.caught_up(node, carried.get(pid)):
                self._report(pid, node, Report.CAUGHT_UP)
            else:
                log.debug("backup %s of partition %d: %s at %d of %d (acked %d, joining %s)", node, pid, status, applied,
                          acks.last_sent, acks.acked, sorted(acks.joining))
        if self._dirty.get(node):
            self._wake[node].set()  # more queued meanwhile

    def _log_after(self, pid: int, seq: int) -> list[Kept] | None:
        """The log's batches after ``seq``; None when it lacks the first of them (the backup catches up anew)."""
        entries = self._logs[pid]
        if not entries:  # a promoted copy with no tail, or a new primary, and a backup behind it
            return [] if seq >= self._shipped_to[pid] else None
        if entries[-1][0] <= seq:
            return []
        if entries[0][0] > seq + 1:
            return None
        after = []
        for e in reversed(entries):  # from the newest: the log keeps a tail of applied batches before them
            if e[0] <= seq:
                break
            after.append(e)
        after.reverse()
        return after

    def _trim(self, pids: Iterable[int]) -> None:
        """The logs' batches every backup applied, once past TAIL + TAIL/2 or past the partition's share of
        ``kept_bytes``, down to TAIL and to half the share (a backup behind keeps what it lacks: MAX_LOG bounds it):
        a log trimmed at every look, a batch or two each time, was 3 % of a node's CPU under P=1024 puts. The tail
        serves backups a promoted primary assumes in sync (``lead``) until they answer; with one backup ``answered``
        frees at once (freed here, cold, they were 4 % of a node's CPU)."""
        share = None if self._kept_bytes is None else self._kept_bytes // max(1, len(self._acks))
        half = None if share is None else share // 2
        added, trimmed_of = self._log_added, self._log_trimmed
        for pid in pids:
            entries = self._logs[pid]
            if len(entries) <= TAIL + TAIL // 2 and (share is None or added[pid] - trimmed_of[pid] <= share):
                continue  # nothing to trim, whatever the backups applied
            known = [self._sent[b, pid] for b in self._backups[pid] if (b, pid) in self._sent]
            floor = min(known, default=self._shipped_to[pid])
            trimmed, weight = trimmed_of[pid], added[pid]
            while len(entries) > MAX_LOG or (entries and entries[0][0] <= floor and (len(entries) > TAIL or (
                    half is not None and weight - trimmed > half and len(entries) > 1))):
                trimmed += entries.popleft()[2]
            trimmed_of[pid] = trimmed

    def kept(self) -> int:
        """What the logs weigh (``stored_bytes``)."""
        return sum(self._log_added.values()) - sum(self._log_trimmed.values())
