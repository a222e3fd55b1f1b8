"""A primary's sender to one backup node (a part of ``NodeReplication``, replication.py, which has ``acks``, ``logs``,
``sent``, ``table`` and the reports): what its partitions' logs hold past the backup's position, one ``ReplicaApply``
at a time, and the answers fed to each partition's ``PrimaryAcks``."""

from __future__ import annotations

import asyncio
import logging
import time

from ...errors import PartitionUnavailableError, RockstateError
from .. import protocol as p
from .backup import TAIL

log = logging.getLogger(__name__)

MAX_LOG = 200_000  # batches a primary keeps for a backup behind; one further behind catches up anew
MAX_ITEMS_BYTES = 8 << 20  # per ReplicaApply, roughly
MAX_ITEMS = 2000  # batches per ReplicaApply
FULL_EVERY = 0.1  # seconds between a sender's looks over all its partitions while writes flow


def stored_bytes(stored: list) -> int:
    """Roughly what a stored batch weighs on the wire: its keys and values (a list's items too)."""
    size = 0
    for op in stored:
        for part in op[2:]:
            if isinstance(part, (bytes, bytearray, memoryview)):
                size += len(part)
            elif isinstance(part, (list, tuple)):
                size += sum(len(x) for x in part if x is not None) + 8 * len(part)
        size += 32
    return size


class PrimarySender:
    """The sender half of ``NodeReplication``: one ``_send_loop`` task per backup node."""

    async def _send_loop(self, node: str) -> None:
        """Sends a backup its partitions' new batches as they come (only the partitions written since: the next
        write waits on it), and looks over all of them (lags, reports, probes, the logs' trim) every FULL_EVERY
        seconds while writes flow, a quarter replica timeout while none do, and when woken by a new table."""
        wake, last_full = self._wake[node], 0.0
        while not self._stopping:
            woken = wake.is_set()
            if not woken:
                try:
                    async with asyncio.timeout(self.timeout() / 4):
                        woken = await wake.wait()
                except TimeoutError:
                    pass
            wake.clear()
            now = time.monotonic()
            full = not woken or not self._dirty.get(node) or now - last_full > FULL_EVERY
            if full:
                last_full = now
            try:
                await self._send_once(node, full)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 -- a sender must go on: log and retry
                log.exception("replication to %s failed", node)
                await asyncio.sleep(0.1)

    async def _send_once(self, node: str, full: bool = True) -> None:
        now, items, size, carried = time.monotonic(), [], 0, {}
        dirty = self._dirty.pop(node, set())
        backs = self.table.backups_of
        pids = [pid for pid in (self.acks if full else dirty) if pid in self.acks and node in backs(pid)]
        for pid in pids:
            acks = self.acks[pid]
            start = self.sent.get((node, pid))
            if full:
                if node in acks.overdue(now, self.timeout()):
                    self._report(pid, node, "unreachable")
                    self._resolve(pid, [])  # a late joining backup is waited for no more
                if node in acks.reported:  # until the coordinator's table has it in sync (a report may have crossed a change)
                    self._report(pid, node, "caught_up")
                if start is None and node in acks.in_sync:
                    self._report(pid, node, "diverged")  # its copy is not this primary's any more (a restore, an ingest)
            if start is None:
                continue
            if size > MAX_ITEMS_BYTES or len(items) >= MAX_ITEMS:
                self._dirty.setdefault(node, set()).add(pid)  # the rest next time
                continue
            entries = self._log_after(pid, start)
            if entries is None:
                self._report(pid, node, "unreachable")  # too far behind: it catches up anew
                continue
            for seq, stored in entries:
                if items and (size > MAX_ITEMS_BYTES or len(items) >= MAX_ITEMS):
                    self._dirty.setdefault(node, set()).add(pid)  # the rest next time (a backup applies a partition's batches in order)
                    break
                items.append([pid, acks.epoch, seq, stored])
                size += stored_bytes(stored)
            else:  # the whole log past its position: applying it, the backup is one request behind at most
                carried[pid] = entries[-1][0] if entries else start
            if full and not entries:  # a probe: is its copy open, is it caught up? (an idle in-sync backup's node
                items.append([pid, acks.epoch, 0, None])  # may have restarted: nothing else would find out)
        if full:
            self._trim(pids)
        if not items:
            return
        address = self.table.addresses.get(node)
        try:
            if address is None:
                raise PartitionUnavailableError(f"backup {node} has no address")
            replies = await self.peer(address).call(p.ReplicaApply(items=items), timeout=self.timeout())
        except RockstateError as e:
            log.warning("backup %s did not apply batches of partitions %s: %s", node, sorted({i[0] for i in items})[:8], e)
            for pid in {i[0] for i in items}:
                self._report(pid, node, "unreachable")
            await asyncio.sleep(min(0.2, self.timeout() / 4))
            return
        for pid, applied, status in replies:
            acks = self.acks.get(pid)
            if acks is None:
                continue
            if status == "not_ready":  # it holds no open copy (a restarted node): no stream brings it back, a copy does
                self._report(pid, node, "diverged")
                continue
            self.sent[node, pid] = applied  # behind: resent from there
            if applied < self.shipped_to.get(pid, 0):
                self._dirty.setdefault(node, set()).add(pid)
            self._resolve(pid, acks.applied(node, applied))
            if node not in acks.in_sync and status == "ok" and acks.caught_up(node, carried.get(pid)):
                self._report(pid, node, "caught_up")
            elif node not in acks.in_sync:
                log.debug("backup %s of partition %d: %s at %d of %d (acked %d, joining %s)", node, pid, status, applied,
                          acks.last_sent, acks.acked, sorted(acks.joining))
        if self._dirty.get(node):
            self._wake[node].set()  # more queued meanwhile

    def _log_after(self, pid: int, seq: int) -> list | None:
        entries = self.logs[pid]
        if not entries or entries[-1][0] <= seq:
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

    def _trim(self, pids) -> None:
        for pid in pids:
            entries = self.logs[pid]
            known = [self.sent[b, pid] for b in self.table.backups_of(pid) if (b, pid) in self.sent]
            floor = min(known, default=self.shipped_to[pid])
            while len(entries) > MAX_LOG or (len(entries) > TAIL and entries[0][0] <= floor):
                entries.popleft()
