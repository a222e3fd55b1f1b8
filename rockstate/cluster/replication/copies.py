"""Catch-up of new or returning backups: copies of partitions on their primary, fetched in one transfer.

The coordinator sends a backup ``ReplicaCatchUp`` naming several partitions of
one primary. The backup asks the primary for their copies (``ReplicaCopy``):
the primary takes each partition's copy (a snapshot) under its write
lock, at batch S, and from that instant ships the backup the batches after S
(``primary.py``). A small partition's copy (up to INLINE_BYTES of keys and
values; a never-written one weighs nothing) comes in the answer to a call on the
nodes' kept connection (``ReplicaInline``), and the backup writes it in one batch.
The other copies' files come back as one stream on a connection of its own (as a
move's do), so a start-up or a join pays at most one transfer per pair of nodes,
not one per partition, and a new cluster none; the backup opens the copies
(several at once) in place of whatever it held and applies the batches from
S + 1; the primary then reports each caught up.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from typing import Awaitable, Callable

from ...errors import ClusterError, PartitionUnavailableError, ProtocolError, RockstateError, UnknownOperationError
from ...rpc import Stream
from ...rpc.async_client import AsyncChannel
from ...store import Store
from ...store.partition import Partition
from ...store.store import partition_dir
from .. import protocol as p
from ..transfer import MoveSource, receive_files
from .backup import Backups
from .primary import Primaries

log = logging.getLogger(__name__)

OPENING = 10.0  # seconds a primary waits for partitions it is opening before it copies those it serves
INLINE_BYTES = 256 << 10  # a partition's keys and values a copy carries in a message, past which it goes in files
INLINE_ANSWER = 4 << 20  # what one ``ReplicaInline`` answer carries at most (the rest goes in files)


class ReplicaCopies:
    """Serves ``ReplicaCopy`` (on the primary) and ``ReplicaCatchUp`` (on the backup); owns the catch-ups running."""

    def __init__(self, store_of: Callable[[], Store], node_id: Callable[[], str | None],
                 peer: Callable[[str], AsyncChannel], owns: Callable[[int], bool],
                 retired: Callable[[int], Awaitable[None]], replica_epoch: Callable[[int], int],
                 primaries: Primaries, backups: Backups) -> None:
        """``peer(address)``: a kept connection; ``owns(pid)``: served here; ``retired(pid)``: waits until a copy this
        node served is gone; ``replica_epoch(pid)``: the table's."""
        self._store_of, self._node_id, self._peer, self._owns = store_of, node_id, peer, owns
        self._retired, self._replica_epoch = retired, replica_epoch
        self._primaries, self._backups = primaries, backups
        self._source: MoveSource | None = None
        self._tasks: dict[int, asyncio.Task] = {}  # pid -> the catch-up carrying it (one task carries several)
        self._cancelled: set[int] = set()  # partitions dropped while their catch-up ran: not adopted

    @property
    def source(self) -> MoveSource:
        if self._source is None:  # made once the store is open
            self._source = MoveSource(self._store_of(), "replicas-out")
        return self._source

    def cancel(self, pid: int) -> bool:
        """No copy of ``pid`` any more: its catch-up, if one runs, drops it rather than adopting it (the other
        partitions its transfer carries go on); whether one runs."""
        if pid not in self._tasks:
            return False
        self._cancelled.add(pid)
        return True

    def running(self) -> list[asyncio.Task]:
        return list(set(self._tasks.values()))

    # -- on the primary ---------------------------------------------------------------

    async def copy(self, msg: p.ReplicaCopy, conn: object) -> Stream:
        """The copies, an export each (what a backup of an earlier version asks for)."""
        served = await self._serving(msg)
        names = [_name(pid, msg.node) for pid in served]
        def take_each() -> None:
            for pid, name in zip(served, names):
                self._take([pid], msg.node, name)
        await asyncio.to_thread(take_each)
        listings = [self.source.listing(name) for name in names]
        return Stream({"parts": [list(part) for part in zip(served, listings)]}, self.source.chunks(list(zip(names, listings))))

    async def copy_group(self, msg: p.ReplicaCopyGroup, conn: object) -> Stream:
        """The copies as one export: a file per state for all of them, not per partition."""
        served = await self._serving(msg)
        name = _name(served[0], msg.node)
        await asyncio.to_thread(self._take, served, msg.node, name)
        files = self.source.listing(name)
        return Stream({"parts": [[pid, []] for pid in served], "files": files}, self.source.chunks([(name, files)]))

    async def inline(self, msg: p.ReplicaInline, conn: object) -> list:
        """The small partitions' copies as entries ([[pid, {state: [keys, values]}], ...]); the others need files."""
        served = await self._serving(msg)
        return await asyncio.to_thread(self._take_inline, served, msg.node)

    def _take_inline(self, pids: list[int], node: str) -> list:
        store, parts, total = self._store_of(), [], 0
        for pid in pids:
            part = store.partition(pid)
            with part.lock:  # a cut, as a copy's: no write between the read and the backup's position
                taken = store.db.entries(pid, min(INLINE_BYTES, INLINE_ANSWER - total))
                if taken is None:
                    continue
                self._primaries.copied(node, pid, part.seq())
            parts.append([pid, taken[0]])
            total += taken[1]
        return parts

    async def _serving(self, msg: p.ReplicaCopy) -> list[int]:
        store = self._store_of()
        pids = sorted({store.check_pid(pid) for pid in msg.partitions})
        served = await self._served(pids, msg.node, _epochs(msg))
        if not served:
            raise PartitionUnavailableError(f"this node is not the primary of partitions {pids[:8]} with backup {msg.node}",
                                            partition=pids[0] if pids else None)
        return served

    async def _served(self, pids: list[int], node: str, epochs: dict[int, int]) -> list[int]:
        """Those of ``pids`` this node is primary of with backup ``node``, waiting up to ``OPENING`` seconds for the
        rest while they may still come: a new table may have named it primary while it still opens them (a new
        cluster's first table, a backup that catches up as soon as it is added). One whose replica set this node
        applied at ``epochs[pid]`` or later is not waited for: it has been handed on (in a join, a copy asked for
        just before a handover waited the whole 10 s, then again for the next, and a join at P=271 took 35-45 s
        instead of 7)."""
        deadline = time.monotonic() + OPENING
        while True:
            served = [pid for pid in pids if self._primaries.serves(pid, node)]
            coming = [pid for pid in pids if pid not in served
                      and (pid not in epochs or self._replica_epoch(pid) < epochs[pid])]
            if not coming or time.monotonic() > deadline:
                return served
            await asyncio.sleep(0.1)

    def _take(self, pids: list[int], node: str, name: str) -> None:
        """Copies of ``pids`` for ``node``, each cut at its batch S under its write lock and shipped the batches
        after S, written as one export ``name`` (a file per state for all of them: per partition, their files and
        fsyncs were most of a join's copies at P=1024)."""
        store = self._store_of()

        def position(part: Partition) -> None:  # under the write lock: the batches after the cut are shipped to it
            self._primaries.copied(node, part.pid, part.seq())

        self.source.take([store.partition(pid) for pid in pids], name, then=position)

    # -- on the backup ----------------------------------------------------------------

    async def catch_up(self, msg: p.ReplicaCatchUp, conn: object) -> dict[int, int]:
        """Copy ``msg.partitions`` ([[pid, replica epoch], ...]) from their primary; answers {pid: bytes} for each
        copied (the others were not: served here, dropped meanwhile, not the source's any more, or it failed)."""
        store = self._store_of()
        if not all(type(item) is list and len(item) == 2 and type(item[1]) is int for item in msg.partitions):
            raise ProtocolError("replica_catch_up's partitions are [[partition, replica epoch], ...]")
        wanted = {store.check_pid(pid): epoch for pid, epoch in msg.partitions}
        dropping = {self._tasks[pid] for pid in wanted if pid in self._cancelled and pid in self._tasks}
        if dropping:
            await asyncio.wait(dropping)  # a copy of one being dropped ends first: never two copies of a partition
        joined = {t for pid in wanted if (t := self._tasks.get(pid)) is not None}
        new = {pid: epoch for pid, epoch in wanted.items() if pid not in self._tasks and not self._owns(pid)}
        if new:
            task = asyncio.ensure_future(self._catch_up(new, msg.source))
            self._tasks.update(dict.fromkeys(new, task))
            joined.add(task)
        answers: dict[int, int] = {}
        for task in joined:
            try:
                copied = await asyncio.shield(task)
            except asyncio.CancelledError:
                if not task.cancelled():
                    raise  # this handler itself is cancelled (the node stops)
                continue
            except (RockstateError, OSError) as e:
                log.warning("backup copies of partitions %s from %s failed: %s", sorted(wanted)[:8], msg.source, e)
                continue
            answers.update({pid: n for pid, n in copied.items() if pid in wanted})
        return answers

    async def _inline(self, source: str, pids: list[int], me: str, epochs: dict[int, int]) -> dict[int, object]:
        """The copies of ``pids`` small enough to come in a message, {pid: entries} (none from a primary of an
        earlier version, which copies them all in files)."""
        try:
            parts = await self._peer(source).call(
                p.ReplicaInline(partitions=pids, node=me, epochs=[epochs[pid] for pid in pids]), timeout=60.0)
        except UnknownOperationError:
            return {}
        if type(parts) is not list or not all(
                type(x) is list and len(x) == 2 and type(x[0]) is int and x[0] in epochs for x in parts):
            raise ClusterError(f"the primary at {source} answered copies that were not asked for: {parts!r:.100}")
        return dict(parts)

    async def _catch_up(self, epochs: dict[int, int], source: str) -> dict[int, int]:
        store, pids = self._store_of(), sorted(epochs)
        steps = [time.perf_counter()]  # the step times, logged: where a slow catch-up waits
        me = self._node_id()
        if me is None:  # the coordinator asks only members: not reached
            raise PartitionUnavailableError("this node has not joined yet; no backup copies")
        targets = {pid: os.path.join(store.path, "replicas-in", partition_dir(pid)) for pid in pids}
        group = targets[pids[0]]  # one export of them all (a primary of an earlier version: one per partition)
        got: dict[int, int] = {}  # pid -> bytes, the copies the primary sent (a group's: each its share)
        where: dict[int, str] = {}  # pid -> the export holding it, when not its own folder
        try:
            for pid in pids:
                self._backups.forget(pid)  # with the tail of the copy it drops
            await asyncio.gather(*(self._retired(pid) for pid in pids))
            for pid in pids:
                store.close_partition(pid)  # replace_partitions puts the new copy in its place
            steps.append(time.perf_counter())

            def receive(answer: dict, read_into: Callable[[memoryview], int]) -> dict[int, int]:  # on the stream's thread
                steps.append(time.perf_counter())  # the copies are taken; their files follow
                for pid, files in answer["parts"]:
                    if pid not in targets or pid in got or pid in inline:
                        raise ClusterError(f"partition {str(pid)[:20]} in a copy's listing was not asked for (or twice)")
                    got[pid] = receive_files(files, targets[pid], read_into) if files else 0
                if "files" in answer:
                    size = receive_files(answer["files"], group, read_into)
                    where.update(dict.fromkeys(got, group))
                    got.update({pid: size // max(1, len(got)) for pid in got})
                return got

            inline = await self._inline(source, pids, me, epochs)  # small copies: no files to fetch
            rest = [pid for pid in pids if pid not in inline]
            asked = [epochs[pid] for pid in rest]
            if not rest:
                steps.append(time.perf_counter())  # the copies are taken, and no files follow
            else:
                try:
                    await self._peer(source).stream(p.ReplicaCopyGroup(partitions=rest, node=me, epochs=asked), receive, timeout=600.0)
                except UnknownOperationError:  # a primary of an earlier version: an export per partition
                    await self._peer(source).stream(p.ReplicaCopy(partitions=rest, node=me, epochs=asked), receive, timeout=600.0)
            steps.append(time.perf_counter())
            keep = {pid: (where.get(pid, targets[pid]), pid) for pid in got if pid not in self._cancelled}  # its exports
            entries = {pid: e for pid, e in inline.items() if pid not in self._cancelled}
            got.update(await asyncio.to_thread(_open_copies, store, keep, {group: list(got)}, entries))  # (some may be cancelled)
            got.update(dict.fromkeys(set(inline) - set(entries), 0))
            steps.append(time.perf_counter())
            copied = {}
            for pid in got:
                if pid in self._cancelled or self._owns(pid):  # dropped meanwhile (a copy opened as it was: closed)
                    if not self._owns(pid):
                        store.close_partition(pid, drop=True)
                    continue
                part = store.partition(pid)
                part.backup = True
                self._backups.adopt(pid, max(epochs[pid], self._replica_epoch(pid)), part.seq())
                copied[pid] = got[pid]
        finally:  # what a failed copy left, removed off the loop (a copy put in place is gone from there already)
            asyncio.get_running_loop().run_in_executor(None, _remove, list(targets.values()))
            for pid in pids:
                if self._tasks.get(pid) is asyncio.current_task():
                    del self._tasks[pid]
                    self._cancelled.discard(pid)
        log.info("backup copies of %d partitions from %s (%d bytes, %d empty; seconds: old copies gone %.3f, "
                 "snapshots %.3f, fetch %.3f, open %.3f)", len(copied), source, sum(copied.values()),
                 sum(1 for n in copied.values() if not n), *(b - a for a, b in zip(steps, steps[1:])))
        return copied


def _open_copies(store: Store, exports: dict, holds: dict, entries: dict[int, object]) -> dict[int, int]:
    """The copies the primary sent in files put in place, and those it sent as entries written in their place;
    answers what each of the latter weighs."""
    if exports:
        store.replace_partitions(exports, None, holds)
    sizes = {}
    for pid, copy in entries.items():
        store.close_partition(pid, drop=True)  # whatever it held of it before goes
        sizes[pid] = store.db.put_entries(pid, copy)
        store.open_partition(pid)
    return sizes


def _remove(paths: list[str]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def _epochs(msg: p.ReplicaCopy) -> dict[int, int]:
    """{pid: replica epoch} of a copy's request (none from a node that sends no epochs)."""
    if msg.epochs is None:
        return {}
    if len(msg.epochs) != len(msg.partitions) or not all(type(e) is int for e in msg.epochs):
        raise ProtocolError("replica_copy's epochs are one int per partition")
    return dict(zip(msg.partitions, msg.epochs))


def _name(pid: int, node: str) -> str:
    return f"{partition_dir(pid)}-{node}"
