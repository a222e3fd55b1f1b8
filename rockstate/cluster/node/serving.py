"""A node's data handlers: writes, reads, scans, staged batches, counts.

Each asks the gate (``ownership.py``) whether this node may serve the partitions
at the request's epoch, waiting while one is frozen for a write, then hands
the request to the store in one call. On a replicated partition, it answers
once the partition's backups acknowledged what it holds (``replication/primary.py``):
so nothing answered, written or read, is lost with the primary.
"""

from __future__ import annotations

import asyncio
from itertools import compress
from typing import Awaitable, Callable, Iterable, Protocol, TypeVar

from ...errors import ProtocolError
from ...ops import DELETE_MANY, PUT_MANY, run_groups
from ...store import StateSpec, Store, staging
from ...store.store import not_bytes
from .. import protocol as p
from .metrics import RequestFigures
from .ownership import Gate

T = TypeVar("T")


class Grouped(Protocol):
    """A data request: its partitions' ``groups`` ([[pid, body], ...]) at the client's table ``epoch``."""

    @property
    def op(self) -> str: ...
    @property
    def groups(self) -> list: ...
    @property
    def epoch(self) -> int: ...


class DataHandlers:
    def __init__(self, gate: Gate, figures: RequestFigures, store_of: Callable[[], Store],
                 acknowledged: Callable[[Iterable[int]], Awaitable[None]], backup_copy: Callable[[int], bool]) -> None:
        """``store_of()``: the store, open once the node registered; ``acknowledged(pids)``: returns once the
        partitions' backups applied what they hold (replication's); ``backup_copy(pid)``: whether this node holds a
        backup copy of ``pid`` (stale reads)."""
        self.gate, self.figures, self._store = gate, figures, store_of
        self.acknowledged, self.backup_copy = acknowledged, backup_copy

    async def _writable(self, msg: Grouped) -> list:
        """The request's groups, once none of its partitions is frozen and all are ours."""
        pids = await self.gate.writable([pid for pid, _ in _groups(msg)], msg.epoch)
        return [(pid, body) for pid, (_, body) in zip(pids, msg.groups)]

    async def write(self, msg: p.Write, conn: object) -> None:
        groups = await self._writable(msg)
        for (_, ops), applied in zip(groups, self._store().write_groups(groups, msg.request)):
            if applied:
                self.figures.keys_written += sum(len(op[2]) if op[0] in (PUT_MANY, DELETE_MANY) else 1 for op in ops)
        await self.acknowledged([pid for pid, _ in groups])

    async def write_runs(self, msg: p.WriteRuns, conn: object) -> None:
        """A ``WriteRuns``: each run the ``Write`` group it stands for (its keys counted by the run's count)."""
        pids = await self.gate.writable(msg.pids, msg.epoch)
        op = PUT_MANY if msg.values is not None else DELETE_MANY
        applied = self._store().write_groups(run_groups(op, msg.state, pids, msg.counts, msg.keys, msg.values), msg.request)
        self.figures.keys_written += sum(compress(msg.counts, applied))
        await self.acknowledged(pids)

    async def compare_and_set(self, msg: p.CompareAndSet, conn: object) -> list:
        groups = await self._writable(msg)
        return await self._acknowledged(groups, self._store().compare_and_set_groups(groups, msg.request))

    async def _acknowledged(self, groups: list, answer: T) -> T:
        await self.acknowledged([pid for pid, _ in groups])
        return answer

    async def read(self, msg: p.Read, conn: object) -> list:
        if not (msg.backup and all(map(self.backup_copy, msg.pids))):  # else a stale read, from this node's backup copies
            await self.acknowledged([self.gate.check(pid, msg.epoch) for pid in msg.pids])
        self.figures.keys_read += len(msg.keys)
        try:
            return self._store().get_runs(msg.state, msg.pids, msg.counts, msg.keys)
        except (KeyError, TypeError, ValueError) as e:
            raise not_bytes(e, "keys of a 'read' message")

    async def scan(self, msg: p.Scan, conn: object) -> list:
        pid = self.gate.check(msg.partition, msg.epoch)
        return await self._acknowledged([(pid, None)], self._store().scan(pid, msg.state, msg.prefix, msg.after, msg.limit))

    async def scan_many(self, msg: p.ScanMany, conn: object) -> list:
        groups = [(self.gate.check(pid, msg.epoch), page) for pid, page in _groups(msg)]
        for pid, page in groups:
            if type(page) is not list or len(page) != 4 or type(page[3]) is not int or not 1 <= page[3] <= p.MAX_SCAN_LIMIT:
                raise ProtocolError(f"a 'scan_many' group of partition {pid} is [prefix, after, stop, limit <= "
                                    f"{p.MAX_SCAN_LIMIT}], not {page!r:.100}")
        await self.acknowledged([pid for pid, _ in groups])
        try:
            store = self._store()
            scan = store.scan_columns if msg.columns else store.scan
            pages = [scan(pid, msg.state, prefix, after, limit, stop) for pid, (prefix, after, stop, limit) in groups]
            return [p.page_columns(*page) for page in pages] if msg.columns else pages
        except (KeyError, TypeError, ValueError) as e:
            raise not_bytes(e, "a 'scan_many' message")

    # -- staged batches (exactly-once) ------------------------------------------------

    async def stage(self, msg: p.Stage, conn: object) -> None:
        groups = await self._writable(msg)
        store = self._store()
        store.check_ops(groups)  # now, not when applied: a bad staged op would fail every later batch
        for pid, ops in groups:
            staging.stage(store.partition(pid), msg.query, msg.batch, msg.operator, msg.attempt, msg.seq, ops)
        # answered without waiting for the backups: the attempt's done waits for them, and they apply a partition's
        # batches in order, so a piece a promoted backup lacks fails the done (the task runs again), never the state

    async def stage_done(self, msg: p.StageDone, conn: object) -> None:
        groups = await self._writable(msg)
        store = self._store()
        for pid, pieces in groups:
            staging.mark_done(store.partition(pid), msg.query, msg.batch, msg.operator, msg.attempt, pieces)
        await self.acknowledged([pid for pid, _ in groups])

    async def advance_batches(self, msg: p.AdvanceBatches, conn: object) -> list:
        groups = await self._writable(msg)
        store = self._store()
        return await self._acknowledged(groups, [staging.advance(store.partition(pid), msg.query, msg.batch) for pid, _ in groups])

    async def finish_task(self, msg: p.FinishTask, conn: object) -> list:
        groups = await self._writable(msg)
        store = self._store()
        return await self._acknowledged(groups, [staging.finish_task(
            store.partition(pid), msg.query, msg.batch, msg.operator, msg.run, msg.task, msg.tasks, msg.pids, msg.failed)
            for pid, _ in groups])

    async def seal(self, msg: p.Seal, conn: object) -> list:
        groups = await self._writable(msg)
        store = self._store()
        return await self._acknowledged(groups, [staging.seal(store.partition(pid), msg.query, msg.batch, msg.operator)
                                                 for pid, _ in groups])

    # -- the coordinator's questions ----------------------------------------------------

    async def stats(self, msg: p.NodeStats, conn: object) -> dict:
        # it reads every entry (the status page asks every few seconds): off the loop, whose heartbeats keep the lease
        return await asyncio.to_thread(self._store().stats, self.gate.ownership.owned())

    async def count(self, msg: p.NodeCount, conn: object) -> int:
        store = self._store()
        return sum(store.partition(pid).count(msg.state)[0] for pid in self.gate.ownership.owned())

    async def define_state(self, msg: p.NodeDefineState, conn: object) -> dict:
        # a column family in every partition, a MANIFEST sync each: off the loop (683 partitions at P=1024 on 3 nodes)
        return (await asyncio.to_thread(self._store().define_state, StateSpec.from_dict(msg.spec))).to_dict()


def _groups(msg: Grouped) -> list:
    """The request's ``groups``, checked for shape; the gate checks each partition."""
    for group in msg.groups:
        if type(group) is not list or len(group) != 2 or type(group[0]) is not int:
            raise ProtocolError(f"groups of a {msg.op!r} message are [[partition, ...], ...], not {group!r:.100}")
    return msg.groups
