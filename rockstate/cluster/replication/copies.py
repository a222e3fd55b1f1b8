"""Catch-up of a new or returning backup: a hard-link copy of the partition on its primary, fetched by the backup.

The coordinator sends the backup ``ReplicaCatchUp``. The backup asks the
primary for a copy (``ReplicaCopy``): the primary takes a hard-link RocksDB
checkpoint under the partition's write lock, at batch S, and from that instant
ships the backup the batches after S (``replication.py``). The copy's files
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
from typing import TYPE_CHECKING

from ...control.write_acks import BackupApply
from ...errors import PartitionUnavailableError
from ...rpc import Stream
from ...store.store import partition_dir
from .. import protocol as p
from ..transfer import MoveSource, receive_files

if TYPE_CHECKING:
    from .partitions import NodeReplication

log = logging.getLogger(__name__)


class ReplicaCopies:
    def __init__(self, replication: "NodeReplication") -> None:
        self.r = replication
        self._source: MoveSource | None = None
        self.handlers = {p.ReplicaCopy: self.copy, p.ReplicaCatchUp: self.catch_up}

    @property
    def source(self) -> MoveSource:
        if self._source is None:
            self._source = MoveSource(self.r.store, "replicas-out")
        return self._source

    # -- on the primary ---------------------------------------------------------------

    async def copy(self, msg: p.ReplicaCopy, conn) -> Stream:
        r, pid = self.r, msg.partition
        if pid not in r.acks or msg.node not in r.table.backups_of(pid):
            raise PartitionUnavailableError(f"this node is not partition {pid}'s primary with backup {msg.node}", partition=pid)
        seq = await asyncio.to_thread(self._take, pid, msg.node)
        return self.source.stream(_name(pid, msg.node), {"seq": seq})

    def _take(self, pid: int, node: str) -> int:
        part, at = self.r.store.partition(pid), []

        def position() -> None:  # under the write lock: the batches after the copy's are the ones shipped to it
            at.append(part.seq())
            self.r.sent[node, pid] = at[0]

        self.source.take(part, _name(pid, node), then=position)
        return at[0]

    # -- on the backup ----------------------------------------------------------------

    async def catch_up(self, msg: p.ReplicaCatchUp, conn) -> int:
        r, pid = self.r, msg.partition
        if r.owns(pid):
            raise PartitionUnavailableError(f"partition {pid} is served here as primary; no backup copy", partition=pid)
        task = r.catching_up.get(pid)
        if task is None or task.done():
            task = r.catching_up[pid] = asyncio.ensure_future(self._catch_up(pid, msg.source, msg.epoch))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.cancelled():
                raise  # this handler itself is cancelled (the node stops)
            raise PartitionUnavailableError(f"this node is no longer a backup of partition {pid}", partition=pid) from None

    async def _catch_up(self, pid: int, source: str, epoch: int) -> int:
        r = self.r
        r.applies.pop(pid, None)
        r.logs.pop(pid, None)  # the tail of the copy it drops
        steps = [time.perf_counter()]  # the step times, logged: where a slow catch-up waits
        await r.retired(pid)
        r.store.close_partition(pid)  # replace_partitions puts the new copy in its place
        target = os.path.join(r.store.path, "replicas-in", partition_dir(pid))
        channel, me = r.peer(source), r.node_id()

        def receive(answer: dict, read_into) -> int:  # on the stream's thread
            steps.append(time.perf_counter())  # the copy is taken; its files follow
            return receive_files(answer["files"], target, read_into)

        try:
            steps.append(time.perf_counter())
            copied = await channel.stream(p.ReplicaCopy(partition=pid, node=me), receive, timeout=600.0)
            steps.append(time.perf_counter())
            await asyncio.to_thread(r.store.replace_partitions, {pid: target})
            steps.append(time.perf_counter())
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
        finally:
            r.catching_up.pop(pid, None)
        part = r.store.partition(pid)
        part.backup = True
        r.applies[pid] = BackupApply(max(epoch, r.table.replica_epoch(pid)), part.seq())
        log.info("backup copy of partition %d from %s at batch %d (%d bytes; seconds: old copy gone %.3f, snapshot %.3f, "
                 "fetch %.3f, open %.3f)", pid, source, part.seq(), copied, *(b - a for a, b in zip(steps, steps[1:])))
        return copied


def _name(pid: int, node: str) -> str:
    return f"{partition_dir(pid)}-{node}"
