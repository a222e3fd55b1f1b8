"""Moving a partition between nodes, in two phases, so writes wait only for the last delta.

Phase 1, the source keeps serving. The target asks the source for a copy:
the source takes a hard-link RocksDB checkpoint of the partition under its
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
import time
from typing import AsyncGenerator, Awaitable, Callable

from ...errors import ClusterError, RockstateError
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
        self.store.replace_partitions({pid: self.dir(pid)})

    def apply(self, pid: int, delta: list) -> None:
        if delta:
            self.store.partition(pid).write(delta)

    def discard(self, pid: int) -> None:
        shutil.rmtree(self.dir(pid), ignore_errors=True)


class NodeMoves:
    """A node's handlers for the steps of a move, as its source and as its target."""

    def __init__(self, gate: Gate, peer: Callable[[str], AsyncChannel], settled: Callable[[int], Awaitable[None]]) -> None:
        self.gate, self.own = gate, gate.ownership
        self.peer = peer  # a kept connection to the node at an address
        self.settled = settled  # waits until an earlier copy of the partition is gone
        self.drained: Callable[[int], Awaitable[int]] = None  # type: ignore[assignment] -- replication.drained
        self.resumed: Callable[[int], None] = lambda pid: None  # replication.resumed: a drain undone
        self.source: MoveSource = None  # type: ignore[assignment] -- set by attach()
        self.target: MoveTarget = None  # type: ignore[assignment]
        self.handlers = {
            p.Freeze: self.freeze,
            p.Drain: self.drain,
            p.Thaw: self.thaw,
            p.Release: self.release,
            p.Pull: self.pull,
            p.PullDelta: self.pull_delta,
            p.PullDiscard: self.pull_discard,
            p.MoveCopy: self.move_copy,
            p.MoveDelta: self.move_delta,
            p.MoveDiscard: self.move_discard,
        }

    def attach(self, store: Store) -> None:
        self.store, self.source, self.target = store, MoveSource(store), MoveTarget(store)

    # -- the source -------------------------------------------------------------------

    async def freeze(self, msg: p.Freeze, conn) -> None:
        if msg.frozen:
            self.own.freeze(msg.partition)
        else:
            self.gate.unfreeze(msg.partition)
            self.resumed(msg.partition)

    async def drain(self, msg: p.Drain, conn) -> int:
        """A handover (``control/migration.py``): writes wait from now on; answers the last batch once acknowledged."""
        pid = self.own.check_owned(msg.partition)
        self.own.freeze(pid)
        try:
            return await self.drained(pid)
        except BaseException:
            self.gate.unfreeze(pid)
            self.resumed(pid)
            raise

    async def move_copy(self, msg: p.MoveCopy, conn) -> Stream:
        return await asyncio.to_thread(self.source.copy, self.own.copy(msg.partition))

    async def move_delta(self, msg: p.MoveDelta, conn) -> list:
        return self.source.delta(self.own.delta(msg.partition, msg.final), msg.final)

    async def move_discard(self, msg: p.MoveDiscard, conn) -> None:
        pid = self.own.check_range(msg.partition)
        self.source.discard(pid)
        self.own.discard(pid)

    async def release(self, msg: p.Release, conn) -> None:
        """Stop serving a partition whose new owner is about to be committed; its files stay until the
        new table arrives (a table that still names this node, after a crashed move, takes it back)."""
        self.gate.release(msg.partition)

    async def thaw(self, msg: p.Thaw, conn) -> None:
        """From a restarted coordinator: moves in flight are over; partitions released for a move that
        never committed are served again once the next table (which the coordinator sends) names them."""
        for pid in self.gate.thaw():
            self.source.discard(pid)
            self.resumed(pid)

    # -- the target -------------------------------------------------------------------

    async def pull(self, msg: p.Pull, conn) -> int:
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
            self.store.close_partition(pid, drop=True)
            raise
        return copied

    async def pull_delta(self, msg: p.PullDelta, conn) -> int:
        """Phase 2: the source is frozen; apply the last writes it recorded."""
        pid = self.own.check_range(msg.partition)
        delta = await self.peer(msg.source).call(p.MoveDelta(partition=pid, final=True))
        self.target.apply(pid, delta)
        return len(delta)

    async def pull_discard(self, msg: p.PullDiscard, conn) -> None:
        if not self.own.owns(self.own.check_range(msg.partition)):
            self.store.close_partition(msg.partition, drop=True)
        self.target.discard(msg.partition)
