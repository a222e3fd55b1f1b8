"""Catch-up of a new or returning backup: a hard-link copy of the partition on its primary, fetched by the backup.

The coordinator sends the backup ``ReplicaCatchUp``. The backup asks the
primary for a copy (``ReplicaCopy``): the primary takes a hard-link RocksDB
checkpoint under the partition's write lock, at batch S, and from that instant
ships the backup the batches after S (``primary.py``). The copy's files
come back as one stream on a connection of its own (as a move's do); the
backup opens the copy in place of whatever copy it had and applies the
batches from S + 1; the primary then reports it caught up.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from typing import Awaitable, Callable

from ...errors import PartitionUnavailableError
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
        self._tasks: dict[int, asyncio.Task] = {}  # pid -> its catch-up

    @property
    def source(self) -> MoveSource:
        if self._source is None:  # made once the store is open
            self._source = MoveSource(self._store_of(), "replicas-out")
        return self._source

    def cancel(self, pid: int) -> bool:
        """Cancel ``pid``'s catch-up; whether one ran."""
        task = self._tasks.pop(pid, None)
        if task is not None:
            task.cancel()
        return task is not None

    def running(self) -> list[asyncio.Task]:
        return list(self._tasks.values())

    # -- on the primary ---------------------------------------------------------------

    async def copy(self, msg: p.ReplicaCopy, conn: object) -> Stream:
        pid = msg.partition
        if not self._primaries.serves(pid, msg.node):
            raise PartitionUnavailableError(f"this node is not partition {pid}'s primary with backup {msg.node}", partition=pid)
        seq = await asyncio.to_thread(self._take, pid, msg.node)
        return self.source.stream(_name(pid, msg.node), {"seq": seq})

    def _take(self, pid: int, node: str) -> int:
        part: Partition = self._store_of().partition(pid)
        at: list[int] = []

        def position() -> None:  # under the write lock: the batches after the copy's are the ones shipped to it
            at.append(part.seq())
            self._primaries.copied(node, pid, at[0])

        self.source.take(part, _name(pid, node), then=position)
        return at[0]

    # -- on the backup ----------------------------------------------------------------

    async def catch_up(self, msg: p.ReplicaCatchUp, conn: object) -> int:
        pid = msg.partition
        if self._owns(pid):
            raise PartitionUnavailableError(f"partition {pid} is served here as primary; no backup copy", partition=pid)
        task = self._tasks.get(pid)
        if task is None or task.done():
            task = self._tasks[pid] = asyncio.ensure_future(self._catch_up(pid, msg.source, msg.epoch))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.cancelled():
                raise  # this handler itself is cancelled (the node stops)
            raise PartitionUnavailableError(f"this node is no longer a backup of partition {pid}", partition=pid) from None

    async def _catch_up(self, pid: int, source: str, epoch: int) -> int:
        store = self._store_of()
        self._backups.forget(pid)  # with the tail of the copy it drops
        steps = [time.perf_counter()]  # the step times, logged: where a slow catch-up waits
        await self._retired(pid)
        store.close_partition(pid)  # replace_partitions puts the new copy in its place
        target = os.path.join(store.path, "replicas-in", partition_dir(pid))
        channel, me = self._peer(source), self._node_id()
        if me is None:  # the coordinator asks only members: not reached
            raise PartitionUnavailableError(f"this node has not joined yet; no backup copy of partition {pid}", partition=pid)

        def receive(answer: dict, read_into: Callable[[memoryview], int]) -> int:  # on the stream's thread
            steps.append(time.perf_counter())  # the copy is taken; its files follow
            return receive_files(answer["files"], target, read_into)

        try:
            steps.append(time.perf_counter())
            copied = await channel.stream(p.ReplicaCopy(partition=pid, node=me), receive, timeout=600.0)
            steps.append(time.perf_counter())
            await asyncio.to_thread(store.replace_partitions, {pid: target})
            steps.append(time.perf_counter())
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
        finally:
            self._tasks.pop(pid, None)
        part = store.partition(pid)
        part.backup = True
        self._backups.adopt(pid, max(epoch, self._replica_epoch(pid)), part.seq())
        log.info("backup copy of partition %d from %s at batch %d (%d bytes; seconds: old copy gone %.3f, snapshot %.3f, "
                 "fetch %.3f, open %.3f)", pid, source, part.seq(), copied, *(b - a for a, b in zip(steps, steps[1:])))
        return copied


def _name(pid: int, node: str) -> str:
    return f"{partition_dir(pid)}-{node}"
