"""A node's data handlers: writes, reads, scans, staged batches, counts.

Each asks the gate (``gate.py``) whether this node may serve the partitions
at the request's epoch, waiting while one is frozen for a write, then hands
the request to the store in one call. On a replicated partition, it answers
once the partition's backups acknowledged what it holds (``replication.py``):
so nothing answered, written or read, is lost with the primary.
"""

from __future__ import annotations

from ...errors import ProtocolError
from ...ops import DELETE_MANY, PUT_MANY
from ...store import StateSpec, Store, staging
from ...store.store import not_bytes
from .. import protocol as p
from .ownership import Gate
from .metrics import NodeMetrics


class DataHandlers:
    def __init__(self, gate: Gate, metrics: NodeMetrics) -> None:
        self.gate, self.metrics = gate, metrics
        self.store: Store = None  # type: ignore[assignment] -- the node opens it once registered
        self.acknowledged = _at_once  # replication.NodeReplication.acknowledged(pids)
        self.backup_copy = lambda pid: False  # whether this node holds a backup copy of pid (stale reads)
        self.handlers = {
            p.Write: self.write,
            p.CompareAndSet: self.compare_and_set,
            p.Read: self.read,
            p.Scan: self.scan,
            p.ScanMany: self.scan_many,
            p.Stage: self.stage,
            p.StageDone: self.stage_done,
            p.AdvanceBatches: self.advance_batches,
            p.FinishTask: self.finish_task,
            p.Seal: self.seal,
            p.NodeStats: self.stats,
            p.NodeCount: self.count,
            p.NodeDefineState: self.define_state,
        }

    async def _writable(self, msg) -> list:
        """The request's groups, once none of its partitions is frozen and all are ours."""
        pids = await self.gate.writable([pid for pid, _ in _groups(msg)], msg.epoch)
        return [(pid, body) for pid, (_, body) in zip(pids, msg.groups)]

    async def write(self, msg: p.Write, conn) -> None:
        groups = await self._writable(msg)
        for (_, ops), applied in zip(groups, self.store.write_groups(groups, msg.request)):
            if applied:
                self.metrics.requests.keys_written += sum(len(op[2]) if op[0] in (PUT_MANY, DELETE_MANY) else 1 for op in ops)
        await self.acknowledged([pid for pid, _ in groups])

    async def compare_and_set(self, msg: p.CompareAndSet, conn) -> list:
        groups = await self._writable(msg)
        return await self._acknowledged(groups, self.store.compare_and_set_groups(groups, msg.request))

    async def _acknowledged(self, groups: list, answer):
        await self.acknowledged([pid for pid, _ in groups])
        return answer

    async def read(self, msg: p.Read, conn) -> list:
        if msg.backup and all(self.backup_copy(pid) for pid, _ in _groups(msg)):
            groups = list(msg.groups)  # a stale read, from this node's backup copies
        else:
            groups = [(self.gate.check(pid, msg.epoch), keys) for pid, keys in _groups(msg)]
            await self.acknowledged([pid for pid, _ in groups])
        for pid, keys in groups:
            if type(keys) is not list:
                raise ProtocolError(f"keys of partition {pid} in a 'read' message must be a list of bytes, not {type(keys).__name__}")
        self.metrics.requests.keys_read += sum(len(keys) for _, keys in groups)
        try:
            return [self.store.get_many(pid, msg.state, keys) for pid, keys in groups]
        except (KeyError, TypeError, ValueError) as e:
            raise not_bytes(e, "keys of a 'read' message")

    async def scan(self, msg: p.Scan, conn) -> list:
        pid = self.gate.check(msg.partition, msg.epoch)
        return await self._acknowledged([(pid, None)], self.store.scan(pid, msg.state, msg.prefix, msg.after, msg.limit))

    async def scan_many(self, msg: p.ScanMany, conn) -> list:
        groups = [(self.gate.check(pid, msg.epoch), page) for pid, page in _groups(msg)]
        for pid, page in groups:
            if type(page) is not list or len(page) != 4 or type(page[3]) is not int or not 1 <= page[3] <= p.MAX_SCAN_LIMIT:
                raise ProtocolError(f"a 'scan_many' group of partition {pid} is [prefix, after, stop, limit <= "
                                    f"{p.MAX_SCAN_LIMIT}], not {page!r:.100}")
        await self.acknowledged([pid for pid, _ in groups])
        try:
            scan = self.store.scan_columns if msg.columns else self.store.scan
            pages = [scan(pid, msg.state, prefix, after, limit, stop) for pid, (prefix, after, stop, limit) in groups]
            return [p.page_columns(*page) for page in pages] if msg.columns else pages
        except (KeyError, TypeError, ValueError) as e:
            raise not_bytes(e, "a 'scan_many' message")

    # -- staged batches (exactly-once) ------------------------------------------------

    async def stage(self, msg: p.Stage, conn) -> None:
        groups = await self._writable(msg)
        self.store.check_ops(groups)  # now, not when applied: a bad staged op would fail every later batch
        for pid, ops in groups:
            staging.stage(self.store.partition(pid), msg.query, msg.batch, msg.operator, msg.attempt, msg.seq, ops)
        await self.acknowledged([pid for pid, _ in groups])

    async def stage_done(self, msg: p.StageDone, conn) -> None:
        groups = await self._writable(msg)
        for pid, pieces in groups:
            staging.mark_done(self.store.partition(pid), msg.query, msg.batch, msg.operator, msg.attempt, pieces)
        await self.acknowledged([pid for pid, _ in groups])

    async def advance_batches(self, msg: p.AdvanceBatches, conn) -> list:
        groups = await self._writable(msg)
        return await self._acknowledged(groups, [staging.advance(self.store.partition(pid), msg.query, msg.batch) for pid, _ in groups])

    async def finish_task(self, msg: p.FinishTask, conn) -> list:
        groups = await self._writable(msg)
        return await self._acknowledged(groups, [staging.finish_task(
            self.store.partition(pid), msg.query, msg.batch, msg.operator, msg.run, msg.task, msg.tasks, msg.pids, msg.failed)
            for pid, _ in groups])

    async def seal(self, msg: p.Seal, conn) -> list:
        groups = await self._writable(msg)
        return await self._acknowledged(groups, [staging.seal(self.store.partition(pid), msg.query, msg.batch, msg.operator)
                                                 for pid, _ in groups])

    # -- the coordinator's questions ----------------------------------------------------

    async def stats(self, msg: p.NodeStats, conn) -> dict:
        return self.store.stats(self.gate.ownership.owned())

    async def count(self, msg: p.NodeCount, conn) -> int:
        return sum(self.store.partition(pid).count(msg.state)[0] for pid in self.gate.ownership.owned())

    async def define_state(self, msg: p.NodeDefineState, conn) -> dict:
        return self.store.define_state(StateSpec.from_dict(msg.spec)).to_dict()


async def _at_once(pids) -> None:
    """Unreplicated: a write is done once applied."""


def _groups(msg) -> list:
    """The request's ``groups``, checked for shape; the gate checks each partition."""
    for group in msg.groups:
        if type(group) is not list or len(group) != 2 or type(group[0]) is not int:
            raise ProtocolError(f"groups of a {msg.op!r} message are [[partition, ...], ...], not {group!r:.100}")
    return msg.groups
