"""Moving a partition between nodes, in two phases, so writes wait only for the last delta.

Phase 1, the source keeps serving. The target asks the source for a copy:
the source takes a copy of the partition (a snapshot) under its
write lock and, from that instant, records every write to the partition.
The copy's files come back as one stream (the answer to ``MoveCopy``, read
on a connection of its own) into the target's ``<store>/incoming/``; it
opens the copy (not serving it) and catches up with the writes recorded
while it fetched.

Phase 2, the partition is frozen on the source (writes wait; the coordinator
does this). The target takes the writes recorded since its catch-up — a
small delta — and applies them. The coordinator then bumps the table epoch:
the target serves, the source drops its copy, and the writes that waited
are refused there (NOT_OWNER) and retried at the target. Writes wait only
for the last delta, however large the partition.

The coordinator's side is ``control/migration.py`` (the steps, and the
rollback: unfreeze the source, which discards the copy and the recording and
serves on); the source's states are ``control/ownership.py``'s. Here: the
node's handlers for each step, and the files they move.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from typing import Awaitable, Callable

from ...errors import ClusterError
from ...rpc import Stream
from ...rpc.async_client import AsyncChannel
from ...store import Store
from ...store.store import partition_dir
from .. import protocol as p
from ..transfer import MoveSource, receive_files
from .ownership import Gate

log = logging.getLogger(__name__)


class MoveTarget:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.root = os.path.join(store.path, "incoming")

    def dir(self, pid: int) -> str:
        return os.path.join(self.root, partition_dir(pid))

    def install(self, pid: int) -> None:
        """The fetched copy becomes the (not yet served) partition (blocking)."""
        self.store.replace_partitions({pid: (self.dir(pid), pid)})  # the source's export: its key group

    def apply(self, pid: int, delta: list) -> None:
        if delta:
            self.store.partition(pid).write(delta)

    def discard(self, pid: int) -> None:
        shutil.rmtree(self.dir(pid), ignore_errors=True)


class NodeMoves:
    """A node's handlers for the steps of a move, as its source and as its target."""

    def __init__(self, gate: Gate, store_of: Callable[[], Store], peer: Callable[[str], AsyncChannel],
                 settled: Callable[[int], Awaitable[None]], drained: Callable[[int], Awaitable[int]],
                 resumed: Callable[[int], None]) -> None:
        """``store_of()``: the store, open once the node registered; ``peer(address)``: a kept connection to the node
        there; ``settled(pid)``: waits until an earlier copy of the partition is gone; ``drained(pid)``: replication's
        drain of a primary handed over (answers its last batch); ``resumed(pid)``: a drain undone."""
        self.gate, self.own, self._store = gate, gate.ownership, store_of
        self.peer, self.settled, self.drained, self.resumed = peer, settled, drained, resumed
        self._source: MoveSource | None = None
        self._target: MoveTarget | None = None

    @property
    def source(self) -> MoveSource:
        if self._source is None:  # made once the store is open
            self._source = MoveSource(self._store())
        return self._source

    @property
    def target(self) -> MoveTarget:
        if self._target is None:
            self._target = MoveTarget(self._store())
        return self._target

    # -- the source -------------------------------------------------------------------

    async def freeze(self, msg: p.Freeze, conn: object) -> None:
        if msg.frozen:
            self.own.freeze(msg.partition)
        else:
            self.gate.unfreeze(msg.partition)
            self.resumed(msg.partition)

    async def drain(self, msg: p.Drain, conn: object) -> int:
        """A handover (``control/migration.py``): writes wait from now on; answers the last batch once acknowledged."""
        pid = self.own.check_owned(msg.partition)
        self.own.freeze(pid)
        try:
            return await self.drained(pid)
        except BaseException:
            self.gate.unfreeze(pid)
            self.resumed(pid)
            raise

    async def move_copy(self, msg: p.MoveCopy, conn: object) -> Stream:
        return await asyncio.to_thread(self.source.copy, self.own.copy(msg.partition))

    async def move_delta(self, msg: p.MoveDelta, conn: object) -> list:
        return self.source.delta(self.own.delta(msg.partition, msg.final), msg.final)

    async def move_discard(self, msg: p.MoveDiscard, conn: object) -> None:
        pid = self.own.check_range(msg.partition)
        self.source.discard(pid)
        self.own.discard(pid)

    async def release(self, msg: p.Release, conn: object) -> None:
        """Stop serving a partition whose new owner is about to be committed; its files stay until the
        new table arrives (a table that still names this node, after a crashed move, takes it back)."""
        self.gate.release(msg.partition)

    async def thaw(self, msg: p.Thaw, conn: object) -> None:
        """From a restarted coordinator: moves in flight are over; partitions released for a move that
        never committed are served again once the next table (which the coordinator sends) names them."""
        for pid in self.gate.thaw():
            self.source.discard(pid)
            self.resumed(pid)

    # -- the target -------------------------------------------------------------------

    async def pull(self, msg: p.Pull, conn: object) -> int:
        """Phase 1: fetch the source's copy while it serves, open it, catch up."""
        pid = self.own.check_range(msg.partition)
        if self.own.owns(pid):
            raise ClusterError(f"node {self.own.node_id} already owns partition {pid}")
        await self.settled(pid)
        target = self.target.dir(pid)
        source = self.peer(msg.source)
        try:
            copied = await source.stream(p.MoveCopy(partition=pid), lambda files, read_into: receive_files(files, target, read_into))
            await asyncio.to_thread(self.target.install, pid)
            catch_up = await source.call(p.MoveDelta(partition=pid, final=False))
            await asyncio.to_thread(self.target.apply, pid, catch_up)
        except BaseException:
            self.target.discard(pid)
            self._store().close_partition(pid, drop=True)
            raise
        return copied

    async def pull_delta(self, msg: p.PullDelta, conn: object) -> int:
        """Phase 2: the source is frozen; apply the last writes it recorded."""
        pid = self.own.check_range(msg.partition)
        delta = await self.peer(msg.source).call(p.MoveDelta(partition=pid, final=True))
        self.target.apply(pid, delta)
        return len(delta)

    async def pull_discard(self, msg: p.PullDiscard, conn: object) -> None:
        if not self.own.owns(self.own.check_range(msg.partition)):
            self._store().close_partition(msg.partition, drop=True)
        self.target.discard(msg.partition)
