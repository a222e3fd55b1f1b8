"""A node: serves the partitions it owns, heartbeats to the coordinator.

Ownership. The node keeps ``owned``: partition -> the table epoch at which it
became the owner. A data request for a partition not in ``owned``, or whose
epoch is older than that, gets NOT_OWNER with the node's table epoch; the
client refreshes its table and retries. A frozen partition (about to move)
makes writes wait until it is unfrozen or gone; reads go on.

Lease. The node serves data requests only while its last heartbeat that
the coordinator answered was sent less than half the coordinator's
``heartbeat_timeout`` ago. The coordinator declares a node dead, and
restores its partitions elsewhere, only after a whole ``heartbeat_timeout``
without hearing from it; so a node cut off from the coordinator (but not
from clients) has stopped serving by then, and no client reads or writes
the old copy of a partition that lives on elsewhere. The cost: while the
coordinator is down for longer than half the timeout, nodes answer
UNAVAILABLE (clients retry) until it is back.

Identity. The node's id is kept in ``<data_dir>/node.json``, so a restarted
node re-registers as itself and finds its partitions on disk.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time

from ..config import CheckpointConfig, NodeConfig, StoreConfig
from ..errors import CheckpointsNotConfiguredError, ClusterError, NotOwnerError, PartitionUnavailableError, ProtocolError, RockstateError, UnknownNodeError
from ..rpc.client import AsyncChannel
from ..rpc.server import Server
from ..store import DELETE_MANY, PUT, PUT_MANY, StateSpec, Store, requests, staging
from ..store.partition import check_ops, check_size
from ..store.store import read_json, write_json
from . import protocol as p
from .ingest import SstIngestor
from .metrics import NodeMetrics
from .moves import CHUNK, MoveSource, MoveTarget
from .node_checkpoints import NodeCheckpoints
from .security import Security
from .table import Table

log = logging.getLogger(__name__)

FREEZE_WAIT = 10.0  # longest a write waits for a moving partition before the client retries


class Node:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.data_dir = os.path.abspath(config.data_dir)
        os.makedirs(self.data_dir, exist_ok=True)
        self.node_id: str | None = (read_json(self._identity_path, {}) or {}).get("node_id")
        self.store: Store | None = None
        self.checkpoints: NodeCheckpoints | None = None
        self.table: Table | None = None
        self.owned: dict[int, int] = {}
        self.frozen: dict[int, asyncio.Event] = {}
        self._retiring: dict[int, asyncio.Future] = {}
        self.released: set[int] = set()  # let go of, waiting for the table that names the new owner
        self.lease, self.lease_until = 1.0, 0.0  # seconds; time.monotonic() until which it may serve
        self._peers: dict[str, AsyncChannel] = {}
        self.metrics = NodeMetrics()
        self.ingestor = SstIngestor(self)  # bulk-loaded SST files (cluster/ingest.py)
        self.handlers = {
            p.Write: self.write,
            p.CompareAndSet: self.compare_and_set,
            p.Read: self.read,
            p.Scan: self.scan,
            p.Stage: self.stage,
            p.StageDone: self.stage_done,
            p.CommitBatch: self.commit_batch,
            p.RollbackBatches: self.rollback_batches,
            p.CommittedBatch: self.committed_batch,
            p.NodeStats: self.stats,
            p.NodeCount: self.count,
            p.NodeDefineState: self.define_state,
            p.ApplyTable: self.apply_table,
            p.SnapshotPartitions: self.snapshot_partitions,
            p.FinishCheckpoint: self.finish_checkpoint,
            p.RestorePartitions: self.restore_partitions,
            p.Freeze: self.freeze,
            p.Thaw: self.thaw,
            p.Release: self.release,
            p.Pull: self.pull,
            p.PullDelta: self.pull_delta,
            p.PullDiscard: self.pull_discard,
            p.MoveCopy: self.move_copy,
            p.MoveChunk: self.move_chunk,
            p.MoveDelta: self.move_delta,
            p.MoveDiscard: self.move_discard,
            **self.ingestor.handlers,
        }
        self.security = Security.from_config(config)
        self.server = Server(self.metrics.timed(self.handlers), config.host, config.port, name="node",
                             inline=(p.Read, p.Write, p.Scan), ssl=self.security.server_ssl, secret=self.security.secret)
        self.coordinator = self._peer(config.coordinator, timeout=30.0)
        self._heartbeat: asyncio.Task | None = None
        self._table_lock = asyncio.Lock()
        self.stopped = asyncio.Event()

    def _mover(self, address: str) -> AsyncChannel:
        """A kept connection to a node partitions move from."""
        if address not in self._peers:
            self._peers[address] = self._peer(address, timeout=120.0)
        return self._peers[address]

    def _peer(self, address: str, timeout: float) -> AsyncChannel:
        return AsyncChannel(address, name="node", timeout=timeout, ssl=self.security.client_ssl, secret=self.security.secret)

    @property
    def _identity_path(self) -> str:
        return os.path.join(self.data_dir, "node.json")

    @property
    def address(self) -> str:
        return self.server.address

    # -- life cycle --------------------------------------------------------

    async def start(self) -> None:
        await self.server.start()
        reply = await self._register()
        self.node_id = reply["node_id"]
        write_json(self._identity_path, {"node_id": self.node_id})
        store_config = StoreConfig(
            partitions=reply["partitions"],
            memory_bytes=self.config.memory_bytes,
            max_key_bytes=reply["limits"]["max_key_bytes"],
            max_value_bytes=reply["limits"]["max_value_bytes"],
            ttl_sweep_interval=self.config.ttl_sweep_interval,
            request_window=self.config.request_window,
        )
        self.store = Store(os.path.join(self.data_dir, "store"), store_config, owned=[])
        self.move_source, self.move_target = MoveSource(self.store), MoveTarget(self.store)
        for spec in reply["states"]:
            self.store.define_state(StateSpec.from_dict(spec))
        if reply.get("checkpoints"):
            self.checkpoints = NodeCheckpoints(self.store, CheckpointConfig(**reply["checkpoints"]))
        await self._apply(Table.from_wire(reply["table"]))
        self._drop_stale_partitions()
        if self.config.metrics_port is not None:
            self.metrics.serve(self.config.host, self.config.metrics_port)
        self._heartbeat = asyncio.create_task(self._heartbeat_loop())
        write_json(os.path.join(self.data_dir, "address.json"), {"address": self.address, "node_id": self.node_id, "pid": os.getpid()})
        log.info("node %s serving on %s", self.node_id, self.address)

    def _drop_stale_partitions(self) -> None:
        """Partition folders left from before a restart whose partitions moved away meanwhile are stale."""
        for name in os.listdir(self.store.path):
            if name.startswith("p") and name[1:].isdigit() and int(name[1:]) not in self.owned:
                self.store.close_partition(int(name[1:]), drop=True)
                shutil.rmtree(os.path.join(self.store.path, name), ignore_errors=True)

    async def _register(self) -> dict:
        while True:  # the coordinator may not be up yet
            try:
                sent = time.monotonic()
                reply = await self.coordinator.call(p.Register(address=self.address, node_id=self.node_id))
                self.lease = reply["heartbeat_timeout"] / 2
                self.lease_until = sent + self.lease
                return reply
            except RockstateError as e:
                if not e.retryable:
                    raise
                await asyncio.sleep(0.2)

    async def leave(self) -> None:
        """Hand every partition to the other nodes, then stop."""
        try:
            await self.coordinator.call(p.Leave(node_id=self.node_id), timeout=600.0)
        except RockstateError as e:
            log.error("could not hand partitions over before stopping: %s", e)
        finally:
            await self.stop()

    async def stop(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        await self.server.stop()
        await self.coordinator.close()
        for peer in self._peers.values():
            await peer.close()
        await asyncio.gather(*self._retiring.values(), return_exceptions=True)
        if self.store is not None:
            self.store.close()
        self.metrics.close()
        self.stopped.set()

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(min(self.config.heartbeat_interval, self.lease / 3))  # a few tries per lease
            try:
                sent = time.monotonic()
                epoch = await self.coordinator.call(p.Heartbeat(node_id=self.node_id, epoch=self.table.epoch), timeout=5.0)
                if epoch > self.table.epoch:
                    await self._apply(Table.from_wire(await self.coordinator.call(p.GetTable())))
                self.lease_until = sent + self.lease  # renewed only with the table the coordinator has now
            except UnknownNodeError:  # it forgot us (we had left): join again
                await self._register()
            except RockstateError as e:
                log.warning("heartbeat to %s failed: %s", self.config.coordinator, e)

    # -- the table -----------------------------------------------------------

    async def apply_table(self, msg: p.ApplyTable, conn) -> int:
        await self._apply(Table.from_wire(msg.table))
        return self.table.epoch

    async def _apply(self, table: Table) -> None:
        async with self._table_lock:
            if self.table is not None and table.epoch <= self.table.epoch:
                return
            # a released partition is not served again, even by a table that still names this node
            # (another move's commit, sent before this one's): only a restarted coordinator gives it back
            mine = {pid: table.since[pid] for pid in table.owned_by(self.node_id) if pid not in self.released}
            gone = (set(self.owned) | self.released) - set(table.owned_by(self.node_id))
            for pid in gone:
                self.owned.pop(pid, None)
                self._unfreeze(pid)  # writes that waited for the move now learn the new owner
                # closing and deleting can take long (the disk frees the space): not while writes wait
                self._retiring[pid] = asyncio.ensure_future(asyncio.to_thread(self._retire, pid))
            self.released -= gone
            for pid in set(mine) - set(self.owned):
                await self._settled(pid)
                self.store.open_partition(pid)
            self.owned = mine
            self.table = table
            self.metrics.partitions.set(len(mine))

    def _retire(self, pid: int) -> None:
        """Drop a partition this node no longer owns, with its move copy and local snapshots."""
        self.store.close_partition(pid, drop=True)
        self.move_source.discard(pid)
        if self.checkpoints is not None:
            self.checkpoints.drop(pid)

    async def _settled(self, pid: int) -> None:
        """Wait until an earlier copy of the partition is gone, before it is opened or replaced again."""
        retiring = self._retiring.pop(pid, None)
        if retiring is not None:
            await retiring

    def _check(self, pid: object, epoch: int, leased: bool = True) -> int:
        """The partition, if this node may serve it at ``epoch`` (and, for client requests, holds its lease)."""
        pid = self.store.check_pid(pid)
        if leased and time.monotonic() > self.lease_until:
            silent = time.monotonic() - self.lease_until + self.lease
            raise PartitionUnavailableError(
                f"node {self.node_id} has not heard from the coordinator for {silent:.1f}s (lease {self.lease:g}s); "
                f"it serves partition {pid} again once it does", partition=pid)
        since = self.owned.get(pid)
        if since is None or epoch < since:
            owner = self.table.owners[pid]
            raise NotOwnerError(
                f"node {self.node_id} does not own partition {pid} at epoch {epoch} (owner: {owner}, table epoch {self.table.epoch})",
                partition=pid, epoch=self.table.epoch,
            )
        return pid

    # -- data ----------------------------------------------------------------

    def _check_ops(self, groups: list) -> None:
        """Every group's ops, before any applies: shape, states, and the cluster's key and value size limits."""
        specs, config = self.store.specs, self.store.config
        for pid, ops in groups:
            check_ops(ops, specs, f"partition {pid}", config.max_key_bytes, config.max_value_bytes)

    async def write(self, msg: p.Write, conn) -> None:
        requests.check_id(msg.request, msg.op)
        groups = await self._writable(msg)
        self._check_ops(groups)
        for pid, ops in groups:
            try:
                applied = self.store.write(pid, ops, msg.request)
            except (KeyError, TypeError, ValueError) as e:
                raise _not_bytes(e, f"ops of partition {pid}")
            if applied:
                self.metrics.keys_written.inc(sum(len(op[2]) if op[0] in (PUT_MANY, DELETE_MANY) else 1 for op in ops))

    async def compare_and_set(self, msg: p.CompareAndSet, conn) -> list:
        requests.check_id(msg.request, msg.op)
        groups = await self._writable(msg)
        for pid, cas in groups:
            if type(cas) is not list or len(cas) != 4 or type(cas[0]) is not str or type(cas[1]) is not bytes \
                    or type(cas[2]) not in (bytes, type(None)) or type(cas[3]) is not bytes:
                raise ProtocolError(f"a compare-and-set of partition {pid} is [state, key, expected or None, new] "
                                    f"(bytes but the state), not {cas!r:.100}")
            spec = self.store.specs.get(cas[0])
            if spec is not None:  # an unknown state fails as it is read
                config = self.store.config
                check_size(spec, PUT, cas[1], cas[3], f"the compare-and-set of partition {pid}", config.max_key_bytes, config.max_value_bytes)
        return [requests.compare_and_set_once(self.store.partition(pid), *cas, msg.request) for pid, cas in groups]

    async def read(self, msg: p.Read, conn) -> list:
        groups = [(self._check(pid, msg.epoch), keys) for pid, keys in _groups(msg)]
        for pid, keys in groups:
            if type(keys) is not list:
                raise ProtocolError(f"keys of partition {pid} in a 'read' message must be a list of bytes, not {type(keys).__name__}")
        self.metrics.keys_read.inc(sum(len(keys) for _, keys in groups))
        try:
            return [self.store.get_many(pid, msg.state, keys) for pid, keys in groups]
        except (KeyError, TypeError, ValueError) as e:
            raise _not_bytes(e, "keys of a 'read' message")

    async def scan(self, msg: p.Scan, conn) -> list:
        pid = self._check(msg.partition, msg.epoch)
        return self.store.scan(pid, msg.state, msg.prefix, msg.after, msg.limit)

    async def _writable(self, msg) -> list:
        """The request's groups, once none of its partitions is moving and all are ours."""
        for pid, _ in _groups(msg):
            while pid in self.frozen:
                try:
                    await asyncio.wait_for(self.frozen[pid].wait(), FREEZE_WAIT)
                except TimeoutError:
                    raise PartitionUnavailableError(f"partition {pid} is moving; retry", partition=pid) from None
        return [(self._check(pid, msg.epoch), body) for pid, body in msg.groups]

    async def stage(self, msg: p.Stage, conn) -> None:
        groups = await self._writable(msg)
        self._check_ops(groups)  # now, not at commit: a bad staged op would fail every commit of the batch
        for pid, ops in groups:
            staging.stage(self.store.partition(pid), msg.query, msg.batch, msg.task, msg.attempt, msg.seq, ops)

    async def stage_done(self, msg: p.StageDone, conn) -> None:
        for pid, _ in await self._writable(msg):
            staging.mark_done(self.store.partition(pid), msg.query, msg.batch, msg.task, msg.attempt)

    async def commit_batch(self, msg: p.CommitBatch, conn) -> list:
        return [staging.commit(self.store.partition(pid), msg.query, msg.batch) for pid, _ in await self._writable(msg)]

    async def rollback_batches(self, msg: p.RollbackBatches, conn) -> list:
        return [staging.rollback(self.store.partition(pid), msg.query, msg.to_batch) for pid, _ in await self._writable(msg)]

    async def committed_batch(self, msg: p.CommittedBatch, conn) -> list:
        return [staging.committed(self.store.partition(self._check(pid, msg.epoch)), msg.query) for pid, _ in _groups(msg)]

    async def stats(self, msg: p.NodeStats, conn) -> dict:
        return self.store.stats(list(self.owned))

    async def count(self, msg: p.NodeCount, conn) -> int:
        return sum(self.store.partition(pid).count(msg.state)[0] for pid in list(self.owned))

    async def define_state(self, msg: p.NodeDefineState, conn) -> dict:
        return self.store.define_state(StateSpec.from_dict(msg.spec)).to_dict()

    # -- checkpoints -----------------------------------------------------------

    def _checkpoints(self) -> NodeCheckpoints:
        if self.checkpoints is None:
            raise CheckpointsNotConfiguredError("the cluster has no checkpoint storage (start the coordinator with --checkpoints URL)")
        return self.checkpoints

    async def snapshot_partitions(self, msg: p.SnapshotPartitions, conn) -> list:
        pids = [self._check(pid, self.table.epoch, leased=False) for pid in msg.partitions]  # the coordinator asks
        return await self._checkpoints().snapshot(msg.checkpoint, msg.retained, pids)

    async def finish_checkpoint(self, msg: p.FinishCheckpoint, conn) -> None:
        pids = [pid for pid in msg.partitions if pid in self.owned]
        if msg.completed:
            self._checkpoints().confirm(msg.checkpoint, pids)
        else:
            self._checkpoints().abort(msg.checkpoint, pids)

    async def restore_partitions(self, msg: p.RestorePartitions, conn) -> list:
        """Restore partitions this node owns, or is about to own (failover)."""
        checkpoints = self._checkpoints()
        stats = []
        for pid in msg.partitions:
            await self._settled(pid)
            self.frozen.setdefault(pid, asyncio.Event())  # writes wait while the partition is replaced
            try:
                stats.append(await asyncio.to_thread(checkpoints.restore, self.store.check_pid(pid), msg.checkpoint, msg.base))
            finally:
                self._unfreeze(pid)
        return stats

    # -- moving partitions ---------------------------------------------------

    async def freeze(self, msg: p.Freeze, conn) -> None:
        if msg.frozen:
            self.frozen.setdefault(self.store.check_pid(msg.partition), asyncio.Event())
        else:
            self._unfreeze(msg.partition)

    def _unfreeze(self, pid: int) -> None:
        event = self.frozen.pop(pid, None)
        if event is not None:
            event.set()

    async def pull(self, msg: p.Pull, conn) -> int:
        """Move phase 1 (see moves.py): fetch the source's copy while it serves, open it, catch up."""
        pid = self.store.check_pid(msg.partition)
        if pid in self.owned:
            raise ClusterError(f"node {self.node_id} already owns partition {pid}")
        await self._settled(pid)
        target = self.move_target.start(pid)
        source = self._mover(msg.source)
        copied = 0
        try:
            for name, size in await source.call(p.MoveCopy(partition=pid)):
                with open(os.path.join(target, name), "wb") as f:
                    while f.tell() < size:
                        data = await source.call(p.MoveChunk(partition=pid, name=name, offset=f.tell(), length=CHUNK))
                        if not data:
                            raise ClusterError(f"{name} of partition {pid} ended at {f.tell()} of {size} bytes")
                        f.write(data)
                copied += size
            await asyncio.to_thread(self.move_target.install, pid)
            catch_up = await source.call(p.MoveDelta(partition=pid, final=False))
            await asyncio.to_thread(self.move_target.apply, pid, catch_up)
        except BaseException:
            self.move_target.discard(pid)
            self.store.close_partition(pid, drop=True)
            raise
        return copied

    async def pull_delta(self, msg: p.PullDelta, conn) -> int:
        """Move phase 2: the source is frozen; apply the last writes it recorded."""
        pid = self.store.check_pid(msg.partition)
        delta = await self._mover(msg.source).call(p.MoveDelta(partition=pid, final=True))
        self.move_target.apply(pid, delta)
        return len(delta)

    async def release(self, msg: p.Release, conn) -> None:
        """Stop serving a partition whose new owner is about to be committed; its files stay until the
        new table arrives (a table that still names this node, after a crashed move, takes it back)."""
        if self.owned.pop(self.store.check_pid(msg.partition), None) is not None:
            self.released.add(msg.partition)
            self._unfreeze(msg.partition)  # writes that waited for the move now learn the new owner

    async def thaw(self, msg: p.Thaw, conn) -> None:
        """From a restarted coordinator: moves in flight are over; partitions released for a move that
        never committed are served again once the next table (which the coordinator sends) names them."""
        for pid in list(self.frozen):
            self._unfreeze(pid)
        for pid in self.owned:
            self.move_source.discard(pid)
        self.released.clear()

    async def pull_discard(self, msg: p.PullDiscard, conn) -> None:
        if self.store.check_pid(msg.partition) not in self.owned:
            self.store.close_partition(msg.partition, drop=True)
        self.move_target.discard(msg.partition)

    def _owned(self, pid: object) -> int:
        pid = self.store.check_pid(pid)
        if pid not in self.owned:
            raise NotOwnerError(f"node {self.node_id} does not own partition {pid}", partition=pid, epoch=self.table.epoch)
        return pid

    async def move_copy(self, msg: p.MoveCopy, conn) -> list:
        return await asyncio.to_thread(self.move_source.copy, self._owned(msg.partition))

    async def move_chunk(self, msg: p.MoveChunk, conn) -> bytes:
        return await asyncio.to_thread(self.move_source.chunk, self._owned(msg.partition), msg.name, msg.offset, msg.length)

    async def move_delta(self, msg: p.MoveDelta, conn) -> list:
        return self.move_source.delta(self._owned(msg.partition), msg.final)

    async def move_discard(self, msg: p.MoveDiscard, conn) -> None:
        self.move_source.discard(self.store.check_pid(msg.partition))


def _groups(msg) -> list:
    """The request's ``groups``, checked for shape; ``Node._check`` checks each partition."""
    for group in msg.groups:
        if type(group) is not list or len(group) != 2 or type(group[0]) is not int:
            raise ProtocolError(f"groups of a {msg.op!r} message are [[partition, ...], ...], not {group!r:.100}")
    return msg.groups


def _not_bytes(e: Exception, what: str) -> Exception:
    """rocksdict's error about a key or value that is not bytes, as the ProtocolError it is."""
    if isinstance(e, RockstateError):  # UnknownStateError is a KeyError too
        return e
    return ProtocolError(f"{what}: {e.args[0] if e.args else e}; keys and values are bytes")


async def run_node(config: NodeConfig) -> None:
    """Run until cancelled or SIGTERM (which leaves the cluster gracefully)."""
    import signal

    node = Node(config)
    await node.start()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: asyncio.ensure_future(node.leave()))
    loop.add_signal_handler(signal.SIGINT, lambda: asyncio.ensure_future(node.leave()))
    await node.stopped.wait()
