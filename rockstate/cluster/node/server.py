"""A node: serves the partitions it owns, heartbeats to the coordinator.

A shell: it receives messages and carries them out, asking
``control/ownership.py`` (through ``ownership.py``'s ``Gate``) which partitions it
may serve — ownership at an epoch, the lease, moves out. Its handlers live by
job: data in ``serving.py``, moves in ``migration.py``, bulk loads in
``ingest.py``, replication in ``replication/``, checkpoints below; ``_handlers``
maps every message the node serves to its handler, in one place. Each part
gets what it uses in its constructor: the store through ``store_of`` (it is
opened once the node registered), replication's functions, the gate.

The lease. The node serves data requests only while its last heartbeat that
the coordinator answered was sent less than half the coordinator's
``heartbeat_timeout`` ago, so a node cut off from the coordinator (but not
from clients) has stopped serving before the coordinator declares it dead
and restores its partitions elsewhere. The cost: while the coordinator is
down for longer than half the timeout, nodes answer UNAVAILABLE (clients
retry) until it is back.

Identity. The node's id is kept in ``<data_dir>/node.json``, so a restarted
node re-registers as itself and finds its partitions on disk.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Awaitable, Callable

from ...checkpoint.manifest import group_dict
from ...checkpoint.participants import LocalPartitions
from ...config import CheckpointConfig, NodeConfig
from ...errors import CheckpointsNotConfiguredError, ClusterError, PartitionUnavailableError, RockstateError, UnknownNodeError
from ...files import read_json, write_json
from ...retry import Retry
from ...rpc.async_client import AsyncChannel
from ...rpc.server import Connection, Server
from ...store import StateSpec, Store
from ...store.partition import REPLICATION
from ...store.requests import REQUESTS
from .. import datadir, protocol as p
from .ownership import Gate
from ..identity import advertised_address
from .ingest import SstIngestor
from ..leader_channel import AsyncCoordinatorChannel
from .metrics import NodeCollector, NodeMetrics
from .migration import NodeMoves
from ..replication.partitions import NodeReplication, kept_bytes
from ..security import Security
from .serving import DataHandlers
from ..table import Table

log = logging.getLogger(__name__)

REGISTER_RETRY = Retry(deadline=None, initial=0.05, maximum=0.5)  # the coordinator may not be up yet
FAILED_HEARTBEAT_RETRY = 0.1  # seconds


class Node:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.data_dir = os.path.abspath(config.data_dir)
        os.makedirs(self.data_dir, exist_ok=True)
        identity = read_json(self._identity_path, {})
        self.node_id: str | None = identity.get("node_id") if isinstance(identity, dict) else None
        self.store: Store | None = None
        self.checkpoints: LocalPartitions | None = None
        self._checkpoint_config: CheckpointConfig | None = None  # the storage of ``checkpoints``
        self.table = Table.empty(0)  # until the coordinator's first
        self.gate = Gate()
        self._retiring: dict[int, asyncio.Future] = {}
        self._peers: dict[str, AsyncChannel] = {}
        self._replica_peers: dict[str, AsyncChannel] = {}
        store_of, node_id = self._store_of, self._node_id
        self.metrics = NodeMetrics(NodeCollector(self._open_store, config.memory_bytes, self.data_dir), node_id)
        self.replication = NodeReplication(store_of, node_id, self._replica_peer, self._report_replicas,
                                           self.gate.ownership.owns, self._settled, kept_bytes(config.memory_bytes))
        primaries, backups = self.replication.primaries, self.replication.backups
        self.metrics.replica_kept.set_function(lambda: primaries.kept() + backups.kept())
        self.data = DataHandlers(self.gate, self.metrics.requests, store_of, primaries.acknowledged,
                                 backups.holds)
        self.moves = NodeMoves(self.gate, store_of, self._mover, self._replacing, primaries.drained, primaries.resumed)
        self.ingestor = SstIngestor(self.gate, store_of, primaries.resync)  # bulk-loaded SST files
        self.handlers = self._handlers()
        self.security = Security.from_config(config.security)
        self.server = Server(self.metrics.timed(self.handlers), config.host, config.port, name="node",
                             inline=(p.Read, p.Write, p.WriteRuns, p.Scan, p.ScanMany, p.ReplicaApply),  # a backup applies on its loop
                             ssl=self.security.server_ssl, secret=self.security.secret)
        self.coordinator = AsyncCoordinatorChannel(config.coordinator, lambda address: self._peer(address, timeout=30.0))
        self._heartbeat: asyncio.Task | None = None
        self._following: asyncio.Task | None = None  # a newer table fetched and applied (_follow)
        self._leaving = False
        self._table_lock = asyncio.Lock()
        self.stopped = asyncio.Event()

    def _handlers(self) -> dict[type[p.Message], Callable[..., Awaitable[object]]]:
        """Every message the node serves, with its handler."""
        data, moves, ingest, metrics = self.data, self.moves, self.ingestor, self.metrics
        backups, copies = self.replication.backups, self.replication.copies
        return {
            # data (serving.py)
            p.Write: data.write,
            p.WriteRuns: data.write_runs,
            p.CompareAndSet: data.compare_and_set,
            p.Read: data.read,
            p.Scan: data.scan,
            p.ScanMany: data.scan_many,
            p.Stage: data.stage,
            p.StageDone: data.stage_done,
            p.AdvanceBatches: data.advance_batches,
            p.FinishTask: data.finish_task,
            p.Seal: data.seal,
            p.NodeStats: data.stats,
            p.NodeCount: data.count,
            p.NodeDefineState: data.define_state,
            # the table and checkpoints (here)
            p.ApplyTable: self.apply_table,
            p.SetCheckpoints: self.set_checkpoints,
            p.SnapshotPartitions: self.snapshot_partitions,
            p.FinishCheckpoint: self.finish_checkpoint,
            p.RestorePartitions: self.restore_partitions,
            # a move's steps, as its source and as its target (migration.py)
            p.Freeze: moves.freeze,
            p.Drain: moves.drain,
            p.Thaw: moves.thaw,
            p.Release: moves.release,
            p.Pull: moves.pull,
            p.PullDelta: moves.pull_delta,
            p.PullDiscard: moves.pull_discard,
            p.MoveCopy: moves.move_copy,
            p.MoveDelta: moves.move_delta,
            p.MoveDiscard: moves.move_discard,
            # bulk loads (ingest.py)
            p.IngestChunk: ingest.chunk,
            p.IngestSst: ingest.ingest,
            p.IngestAbort: ingest.abort,
            # replication: a backup's side (replication/backup.py), a backup's copy (replication/copies.py)
            p.ReplicaApply: backups.apply,
            p.ReplicaPositions: backups.positions,
            p.ReplicaCopy: copies.copy,
            p.ReplicaCopyGroup: copies.copy_group,
            p.ReplicaInline: copies.inline,
            p.ReplicaCatchUp: copies.catch_up,
            # the coordinator's status page (metrics.py)
            p.NodeFigures: metrics.figures,
            p.NodeIdentity: metrics.identity,
        }

    def _store_of(self) -> Store:
        """The store, for the parts: open once the node registered (the gate refuses every partition before)."""
        if self.store is None:
            raise PartitionUnavailableError(f"node {self.node_id} has not joined the cluster yet; retry")
        return self.store

    def _open_store(self) -> Store | None:
        return self.store

    def _node_id(self) -> str | None:
        return self.node_id

    def _id(self) -> str:
        if self.node_id is None:  # before it registered: nothing that sends its id runs then
            raise ClusterError("this node has not registered with the coordinator")
        return self.node_id

    @property
    def owned(self) -> list[int]:
        return self.gate.ownership.owned()

    def _mover(self, address: str) -> AsyncChannel:
        """A kept connection to a node partitions move from."""
        if address not in self._peers:
            self._peers[address] = self._peer(address, timeout=120.0)
        return self._peers[address]

    def _replica_peer(self, address: str) -> AsyncChannel:
        """A kept connection to a node this one replicates to or copies from (apart from moves' big transfers)."""
        if address not in self._replica_peers:
            self._replica_peers[address] = self._peer(address, timeout=30.0)
        return self._replica_peers[address]

    async def _report_replicas(self, reports: list) -> None:
        await self.coordinator.call(p.ReplicaReport(node_id=self._id(), reports=reports), timeout=5.0)

    def _peer(self, address: str, timeout: float) -> AsyncChannel:
        return AsyncChannel(address, name="node", timeout=timeout, ssl=self.security.client_ssl, secret=self.security.secret)

    @property
    def _identity_path(self) -> str:
        return os.path.join(self.data_dir, "node.json")

    @property
    def address(self) -> str:
        return advertised_address(self.config.host, self.config.advertise_host, self.server.port)

    # -- life cycle --------------------------------------------------------

    async def start(self) -> None:
        self._dir_lock = datadir.lock(self.data_dir, "node")  # before it registers: a second one must not
        self.metrics.loop_lag.start()
        await self.server.start()
        reply = await self._register()
        write_json(self._identity_path, {"node_id": self.node_id})
        # the cluster's partition count and key and value limits are the coordinator's
        # and RocksDB's share of memory_bytes: the rest is the replicas' kept batches
        store_config = self.config.store.model_copy(update={"partitions": reply["partitions"], **reply["limits"],
                                                            "memory_bytes": self.config.memory_bytes - kept_bytes(self.config.memory_bytes)})
        # the internal states every partition of a node uses, created as a partition opens (not by its first write, on the loop)
        self.store = Store(os.path.join(self.data_dir, "store"), store_config, owned=[], reserved=(REQUESTS, REPLICATION))
        for spec in reply["states"]:
            self.store.define_state(StateSpec.from_dict(spec))
        self._use_checkpoints(reply.get("checkpoints"))
        await self._apply(Table.from_wire(reply["table"]))
        self._drop_stale_partitions()
        if self.config.metrics_port is not None:
            self.metrics.serve(self.config.host, self.config.metrics_port, self.security)
        self._heartbeat = asyncio.create_task(self._heartbeat_loop())
        write_json(os.path.join(self.data_dir, "address.json"), {"address": self.address, "node_id": self.node_id, "pid": os.getpid()})
        log.info("node %s joined: serving %d partitions on %s (table epoch %d)", self.node_id, len(self.owned), self.address, self.table.epoch)

    def _drop_stale_partitions(self) -> None:
        """What the store holds from before a restart of partitions that moved away meanwhile is stale."""
        self._store_of().drop_all_but(set(self.owned))

    async def _register(self) -> dict:
        async def once() -> dict:
            sent = time.monotonic()
            reply = await self.coordinator.call(p.Register(address=self.address, node_id=self.node_id, zone=self.config.zone))
            self.node_id = reply["node_id"]
            self.gate.ownership.join(self.node_id, reply["partitions"], reply["heartbeat_timeout"] / 2, sent)
            return reply

        return await REGISTER_RETRY.acall(once)

    async def leave(self) -> None:
        """Hand every partition to the other nodes, then stop."""
        log.info("node %s leaving: handing its %d partitions to the others", self.node_id, len(self.owned))
        self._leaving = True
        try:
            await self.coordinator.call(p.Leave(node_id=self._id()), timeout=600.0)
        except RockstateError as e:
            log.error("could not hand partitions over before stopping: %s", e)
        finally:
            await self.stop()

    async def stop(self) -> None:
        for task in (self._heartbeat, self._following):
            if task is not None:
                task.cancel()
        await self.replication.stop()
        await self.server.stop()
        await self.coordinator.close()
        for peer in [*self._peers.values(), *self._replica_peers.values()]:
            await peer.close()
        await asyncio.gather(*self._retiring.values(), return_exceptions=True)
        if self.store is not None:
            self.store.close()
        self.metrics.close()
        datadir.release(getattr(self, "_dir_lock", None))
        self.stopped.set()

    async def _heartbeat_loop(self) -> None:
        interval = min(self.config.heartbeat_interval, self.gate.ownership.lease / 3)  # a few tries per lease
        failed = 0  # heartbeats in a row that got no answer
        while True:
            # after a failure, soon again: a new leader elected meanwhile renews the lease sooner
            await asyncio.sleep(min(interval, FAILED_HEARTBEAT_RETRY) if failed else interval)
            try:
                sent = time.monotonic()
                epoch = await self.coordinator.call(p.Heartbeat(node_id=self._id(), epoch=self.table.epoch), timeout=5.0)
                if epoch > self.table.epoch:
                    self._follow(sent, epoch)  # renewed once that table is applied
                else:
                    self.gate.ownership.renewed(sent)  # renewed only with the table the coordinator has now
                failed = 0
            except UnknownNodeError:  # it forgot us (we had left): join again, unless we are leaving
                if self._leaving:
                    return  # the coordinator has let us go: joining again would hand us partitions as we exit
                await self._register()
            except RockstateError as e:
                failed += 1
                if failed == 1 or failed % 20 == 0:  # one line, then every few seconds, while it lasts
                    log.warning("heartbeat to %s failed (%d in a row): %s", self.coordinator.address, failed, e)

    def _follow(self, sent: float, epoch: int) -> None:
        """The coordinator's newer table (``epoch``, named by a heartbeat sent at ``sent``) fetched and applied beside
        the heartbeats, not in their loop: it waits for the table being applied (its partitions opening: seconds at
        P=1024), and a node whose heartbeats waited with it was declared dead (all 3 at the start-up of P=1024)."""
        if self._following is None or self._following.done():
            self._following = asyncio.create_task(self._fetch_table(sent, epoch))

    async def _fetch_table(self, sent: float, epoch: int) -> None:
        try:
            await self._apply(Table.from_wire(await self.coordinator.call(p.GetTable())))
        except RockstateError as e:  # the next heartbeat that finds a newer table tries again
            log.warning("could not fetch the table from %s: %s", self.coordinator.address, e)
            return
        if self.table.epoch >= epoch:  # with the table the coordinator had when it answered
            self.gate.ownership.renewed(sent)

    # -- the table -----------------------------------------------------------

    async def apply_table(self, msg: p.ApplyTable, conn: Connection) -> int:
        table = Table.from_wire(msg.table) if msg.table is not None else self.table.patched(msg.delta)
        if table is not None:  # None: a delta on another table than this node's (the whole one follows)
            await self._apply(table)
        return self.table.epoch

    async def _apply(self, table: Table) -> None:
        async with self._table_lock:
            change = self.gate.apply_table(table)
            if change is None:
                return
            for pid in change.retired:
                # closing and deleting can take long (the disk frees the space): not while writes wait
                self._retiring[pid] = asyncio.ensure_future(asyncio.to_thread(self._retire, pid))
            for pid in change.opened:
                await self._settled(pid)
            # RocksDB opens wait on file syncs (~40 ms each): in threads, several at once, off the loop (heartbeats go on;
            # 341 partitions opened on the loop blocked it 6 s, the lease is 1.5 s)
            await asyncio.to_thread(self._store_of().open_partitions, change.opened)
            self.replication.apply_table(table, change.opened)  # before they serve: every write to them is shipped
            for pid in change.opened:
                self.gate.ownership.opened(pid)
            self.table = table
            self.metrics.partitions.set(len(self.owned))
            if change.opened or change.retired:
                log.info("node %s at epoch %d: received partitions %s, released %s", self.node_id, table.epoch,
                         sorted(change.opened), sorted(change.retired))

    def _retire(self, pid: int) -> None:
        """Drop a partition this node no longer owns, with its move copy."""
        self._store_of().close_partition(pid, drop=True)
        self.moves.source.discard(pid)

    async def _replacing(self, pid: int) -> None:
        """Before a copy moved in or restored replaces the partition: no backup copy of it here any more."""
        self.replication.drop_backup(pid)
        await self._settled(pid)

    async def _settled(self, pid: int) -> None:
        """Wait until an earlier copy of the partition is gone, before it is opened or replaced again."""
        retiring = self._retiring.pop(pid, None)
        if retiring is not None:
            await retiring

    # -- checkpoints -----------------------------------------------------------

    async def set_checkpoints(self, msg: p.SetCheckpoints, conn: Connection) -> None:
        self._use_checkpoints(msg.checkpoints)

    def _use_checkpoints(self, checkpoints: dict | None) -> None:
        """The storage the coordinator names, at registration or when it takes the lead; the same one again keeps
        the local snapshots (the next checkpoint's increment is made from them)."""
        config = CheckpointConfig(**checkpoints) if checkpoints else None
        if config == self._checkpoint_config:
            return
        self.checkpoints = None if config is None else LocalPartitions(self._store_of(), config, keys=self.security.checkpoint_keys)
        if self._checkpoint_config is not None or config is not None:
            log.info("node %s checkpoints to %s", self.node_id, "nothing" if config is None else config.url)
        self._checkpoint_config = config

    def _checkpoints(self) -> LocalPartitions:
        if self.checkpoints is None:
            raise CheckpointsNotConfiguredError("the cluster has no checkpoint storage (start the coordinator with --checkpoints URL)")
        return self.checkpoints

    async def snapshot_partitions(self, msg: p.SnapshotPartitions, conn: Connection) -> dict | list:
        pids = [self.gate.check(pid, self.table.epoch, leased=False) for pid in msg.partitions]  # the coordinator asks
        manifests = await self._checkpoints().snapshot(msg.checkpoint, msg.retained, pids)
        return group_dict(manifests) if manifests else []  # the files once, not once per partition

    async def finish_checkpoint(self, msg: p.FinishCheckpoint, conn: Connection) -> None:
        pids = [pid for pid in msg.partitions if self.gate.ownership.owns(pid)]
        await self._checkpoints().finish(msg.checkpoint, msg.completed, pids)

    async def restore_partitions(self, msg: p.RestorePartitions, conn: Connection) -> list:
        """Restore partitions this node owns, or is about to own (failover)."""
        checkpoints = self._checkpoints()
        stats = []
        for pid in msg.partitions:
            await self._replacing(pid)
            self.gate.ownership.freeze(pid)  # writes wait while the partition is replaced
            try:
                stats += [s.to_dict() for s in await checkpoints.restore(msg.checkpoint, [pid], msg.base)]
                self.replication.primaries.diverged(pid)  # its backups hold another history: they catch up anew
            finally:
                self.gate.unfreeze(pid)
        log.info("node %s restored partitions %s from checkpoint %s", self.node_id, list(msg.partitions), msg.checkpoint)
        return stats


async def run_node(config: NodeConfig) -> None:
    """Run until cancelled or SIGTERM (which leaves the cluster gracefully)."""
    import signal

    node = Node(config)
    await node.start()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: asyncio.ensure_future(node.leave()))
    loop.add_signal_handler(signal.SIGINT, lambda: asyncio.ensure_future(node.leave()))
    await node.stopped.wait()
