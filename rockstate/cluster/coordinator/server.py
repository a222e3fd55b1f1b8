"""The coordinator: membership, the partition table, the state catalog, cluster-wide answers.

A shell: it receives messages and carries out what the control plane's pure
objects decide — ``control/membership.py`` (who is alive), ``control/placement.py``
(the moves that balance the table, the failover of a dead node's partitions)
and ``control/migration.py`` (the steps of one move).

A dead node keeps its partitions (they are unavailable until it returns, or,
with checkpoints configured, until they are restored elsewhere): moving them
without their data would lose it. A join or a graceful leave moves each
partition whose owner changes, at most ``max_concurrent_migrations`` at once;
every finished move is its own epoch. Everything is persisted (``persistence.py``:
``<data_dir>/coordinator.json``, or documents on ZooKeeper) before it is acted
on, so a restarted coordinator resumes with the same table.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import time

from ...config import CheckpointConfig, CoordinatorConfig
from ...control import placement
from ...control.leadership import CoordinatorRole
from ...control.membership import Membership, MemberStatus
from ...control.migration import Migration
from ...errors import CheckpointsNotConfiguredError, RockstateError
from ...files import write_json
from ...retry import Retry
from ...rpc.server import Server
from ...store import StateSpec
from .web import StatusServer
from .. import datadir, protocol as p
from .answers import ClusterAnswers
from .checkpoints import ClusterCheckpoints
from .election import Election
from .leading import Leading
from .membership import MemberHandlers
from .metrics import CoordinatorMetrics
from .migration import run_move
from .peers import Peer, Peers
from .persistence import DataDirectory, ZooKeeperDocuments
from ..replication.in_sync import ReplicaControl
from ..security import Security
from ..table import Table

log = logging.getLogger(__name__)

CHECKPOINT_REQUESTS = {  # what the checkpoint driver answers
    p.TriggerCheckpoint: lambda c, msg: c.checkpoint(),
    p.ListCheckpoints: lambda c, msg: c.history(),
    p.RestoreCluster: lambda c, msg: c.restore(msg.checkpoint, msg.savepoint),
    p.CreateSavepoint: lambda c, msg: c.savepoint(msg.name, msg.checkpoint),
    p.InspectCheckpoint: lambda c, msg: c.inspect(msg.checkpoint),
    p.ListSavepoints: lambda c, msg: c.savepoints(),
}


class _NotYet(Exception):
    """A failover try that did not restore the partitions: no live node yet, or a restore failed."""


BALANCE_CHECK = 5.0  # seconds between the monitor's checks that the table is balanced
FAILOVER_RETRY = Retry(deadline=None, initial=0.2, maximum=5.0, retry_on=lambda e: isinstance(e, _NotYet))  # until it is done


class Coordinator(ClusterAnswers, MemberHandlers, Leading):
    def __init__(self, config: CoordinatorConfig) -> None:
        self.config = config
        self.data_dir = os.path.abspath(config.data_dir)
        os.makedirs(self.data_dir, exist_ok=True)
        self.election = Election(config) if config.zookeeper else None
        self.role = CoordinatorRole(alone=self.election is None)
        self.persistence: DataDirectory | ZooKeeperDocuments = DataDirectory(self.data_dir)  # ZooKeeper's once it contends
        self.security = Security.from_config(config.security)
        self.peers = Peers(self.security)
        self.table_lock = asyncio.Lock()  # held while partitions move, and by checkpoints and restores
        self.define_lock = asyncio.Lock()  # states are defined one at a time
        self._load(self.persistence.load() if self.election is None else {})
        self.handlers = {
            p.Register: self.register,
            p.Heartbeat: self.heartbeat,
            p.Leave: self.leave,
            p.GetTable: self.get_table,
            p.DefineState: self.define_state,
            p.ClusterStats: self.cluster_stats,
            p.Count: self.count,
            p.Status: self.status,
            p.Events: self.events_after,
            p.PipelineProgress: self.pipeline_progress,
            p.ReplicaReport: lambda msg, conn: self.replicas.report(msg, conn),  # the replicas of the record loaded last
            **dict.fromkeys(CHECKPOINT_REQUESTS, self.checkpoint_request),
        }
        self.metrics, self.web = CoordinatorMetrics(self), StatusServer(self)  # metrics count events from here on
        self.server = Server(self.leader_only(self.handlers), config.host, config.port, name="coordinator",
                             ssl=self.security.server_ssl, secret=self.security.secret)
        self._tasks: set[asyncio.Task] = set()

    def _load(self, saved: dict) -> None:
        """Take up a saved record ({}: a new cluster)."""
        self.table = Table.from_wire(saved["table"]) if saved else Table.empty(self.config.partitions)
        self.specs = {d["name"]: StateSpec.from_dict(d) for d in saved.get("states", [])}
        # a restarted coordinator, or a new leader, gives every node a full timeout to check in
        self.membership = Membership.from_wire(self.config.heartbeat_timeout, saved, time.monotonic())
        self.pipelines: dict[str, dict] = saved.get("pipelines", {})
        self.failovers: set[str] = set(saved.get("failovers", []))  # dead nodes whose partitions are not restored yet
        self.events = self.persistence.events
        self.replicas = ReplicaControl(self, saved)  # replica sets and in-sync sets (cluster/replicas.py)
        self.checkpoints = ClusterCheckpoints(
            self.checkpoint_config, self.table.partitions, lock=self.table_lock, owners=self.partitions_by_node,
            channel=lambda peer: peer.rpc(self.security), specs=lambda: self.specs,
            define=self.define, event=self.event, keys=self.security.checkpoint_keys) if self.checkpoint_config else None
        # a new cluster on a storage that holds checkpoints starts from the latest one
        self._restore_on_start = not saved and self.checkpoints is not None  # and it holds one: see _prepare()
        self._resumed = asyncio.Event()  # moves wait until the nodes' leases under an earlier table could have run out

    @property
    def checkpoint_config(self) -> CheckpointConfig | None:
        """The cluster's checkpoints (a node gets them at registration); None without a storage URL."""
        return self.config.checkpoints if self.config.checkpoints and self.config.checkpoints.url else None

    @property
    def members(self):
        return self.membership.members

    def peer(self, node_id: str) -> Peer:
        return self.peers[self.membership[node_id]]

    @property
    def address(self) -> str:
        return self.server.address

    def _record(self) -> dict:
        """What the coordinator persists, by section (``persistence.py``)."""
        return {
            "table": self.table.to_wire(),
            "states": [s.to_dict() for s in self.specs.values()],
            **self.membership.to_wire(),
            "pipelines": self.pipelines,
            "failovers": sorted(self.failovers),
            **self.replicas.to_wire(),  # "replicas" and "zones"
        }

    async def _save(self) -> None:
        await self.persistence.save(self._record())

    def event(self, event: str, **data) -> None:
        """Record a cluster event (member joined/left/dead, migration, partition restored, checkpoint...)."""
        self.events.append(event, **data)
        self.metrics.observe(event, data)
        log.info("event %s %s", event, data)

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        """A background task's end; a failure is said (the monitor redoes what is still due), a bug loudly."""
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        e = task.exception()
        if isinstance(e, (RockstateError, OSError)):
            log.warning("%s failed: %s", task.get_coro().__qualname__, e)
        else:
            log.error("%s failed", task.get_coro().__qualname__, exc_info=e)

    # -- life cycle --------------------------------------------------------

    async def start(self) -> None:
        self._dir_lock = datadir.lock(self.data_dir, "coordinator")  # before it serves: a second one must not
        if self.election is None:
            await self._prepare()
            self._begin()
        await self.server.start()
        if self.election is not None:  # it leads once elected (Leading.elected)
            self.persistence = await self.election.start(self.address, self)
        status_url = None if self.config.http_port is None else await self.web.start(self.config.host, self.config.http_port)
        write_json(os.path.join(self.data_dir, "address.json"), {"address": self.address, "pid": os.getpid(), "status_url": status_url})
        log.info("coordinator serving on %s with %d partitions", self.address, self.table.partitions)

    async def _prepare(self) -> None:
        """Before it leads: the checkpoint storage opened, so a request answered from then on finds it."""
        if self.checkpoints is not None:
            await self.checkpoints.open()
            self._restore_on_start = self._restore_on_start and self.checkpoints.latest() is not None

    def _begin(self) -> None:
        """Lead: the tasks of the coordinator in charge (monitor, resumption, periodic checkpoints)."""
        self._spawn(self._monitor())
        if self.members:
            self._spawn(self._resume())
        else:
            self._resumed.set()
        if self.checkpoints is not None and self.checkpoint_config.interval:
            self._spawn(self.checkpoints.periodic())

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.election is not None:
            await self.election.stop()
        await self.server.stop()
        await self.web.stop()
        await self.peers.close()
        datadir.release(getattr(self, "_dir_lock", None))

    async def _resume(self) -> None:
        """After a restart: once the nodes have checked in, clear what moves in flight left, and rebalance.

        A move interrupted by the crash never changed the table (it changes
        last), so its source still owns the partition: thawing it and
        dropping the copies rolls the move back; the rebalance redoes it.
        """
        started = time.monotonic()
        while time.monotonic() - started < self.config.heartbeat_timeout and not self.membership.checked_in_since(started):
            await asyncio.sleep(0.05)
        async with self.table_lock:
            await self._broadcast(p.Thaw())
            # a new epoch: a source that let go of a partition just before the crash takes it back
            await self._publish(self.table.with_addresses(self.membership.addresses()))
        self._resumed.set()
        self.event("coordinator_resumed", epoch=self.table.epoch)
        for node_id in self.failovers:  # a failover the crash interrupted is done now
            self._spawn(self._failover(node_id))
        await self._rebalance()

    async def _monitor(self) -> None:
        last_ensure = last_balance = time.monotonic()
        while True:
            await asyncio.sleep(min(0.25, self.config.heartbeat_timeout / 4))
            for m in self.membership.expire(time.monotonic()):
                await self._declare_dead(m.node_id)
            if time.monotonic() - last_ensure > 1.0:
                last_ensure = time.monotonic()
                self._spawn(self.replicas.ensure())  # backups added, dropped, caught up anew
            if time.monotonic() - last_balance > BALANCE_CHECK and self._unbalanced():
                last_balance = time.monotonic()
                # redone here, not only on a membership change: a move or a welcome-back that failed would
                # otherwise leave a node without its share until the next join or death
                self._spawn(self._rebalance())

    def _unbalanced(self) -> bool:
        """Moves are due and nothing is changing the table now."""
        return (self._resumed.is_set() and not self.table_lock.locked() and not self._forming()
                and bool(placement.rebalance(self.table.owners, self.membership.statuses())))

    async def _declare_dead(self, node_id: str, **why) -> None:
        self.event("member_dead", node=node_id, address=self.membership[node_id].address, **why)
        if self.checkpoints is not None:
            self.failovers.add(node_id)
        await self._save()
        self._spawn(self._dead(node_id))

    async def restore_lost(self, dead: str) -> None:
        """A dead node's partitions whose election found no candidate: restored from the checkpoint, as without backups."""
        if self.checkpoints is not None and self.membership.statuses().get(dead) is MemberStatus.DEAD:
            self.failovers.add(dead)
            await self._save()
            self._spawn(self._failover(dead))

    async def _dead(self, node_id: str) -> None:
        """A dead node: its backups promoted where it was primary; then what has no replica left is restored."""
        await self.replicas.members_dead([node_id])
        if self.checkpoints is not None:
            await self._failover(node_id)
        if self.replicas.enabled:
            self._spawn(self.replicas.ensure())  # backup_count restored first (not after the moves): durability before balance
            await self._rebalance()  # the promoted primaries spread out again

    # -- membership ------------------------------------------------------------

    # -- the table -----------------------------------------------------------

    async def get_table(self, msg: p.GetTable, conn) -> dict:
        return {**self.table.to_wire(), "limits": self._limits()}

    async def _rebalance(self) -> int:
        """Move partitions until the table is balanced over the live nodes; returns how many moved."""
        await self._resumed.wait()
        async with self.table_lock:
            if len(self.membership.alive()) < (self.config.initial_cluster_size if self._forming() else 1):
                return 0
            planned = placement.rebalance(self.table.owners, self.membership.statuses())
            limit = asyncio.Semaphore(self.config.max_concurrent_migrations)

            async def one(move: placement.Move) -> None:
                async with limit:
                    await self._move(move)

            # every move ends before the lock is let go: a failed one must not leave the others running beside the
            # next rebalance (it would plan the same partitions again, and two handovers of one would race)
            failed = [r for r in await asyncio.gather(*(one(mv) for mv in planned), return_exceptions=True) if r is not None]
            if failed:
                raise failed[0]
            if self._restore_on_start and None not in self.table.owners:
                self._restore_on_start = False
                chk = self.checkpoints.latest()
                await self.checkpoints.restore_partitions(chk, self.partitions_by_node())
                self.event("cluster_restored", checkpoint=chk, reason="new cluster on a storage with checkpoints")
            self._spawn(self.replicas.ensure())
            return len(planned)

    def _forming(self) -> bool:
        """A new cluster: no partition was ever assigned."""
        return all(owner is None for owner in self.table.owners)

    async def _failover(self, dead: str) -> None:
        """Give a dead node's partitions to the live nodes, restored from the latest completed checkpoint.

        What was written to them after that checkpoint is lost; the
        ``partition_restored`` events name the checkpoint so a pipeline can
        rewind to it and replay. A failed restore (storage or a target node
        failing) is retried until it works or the node comes back: until
        then its partitions are unavailable, never served from an older state.
        """
        async def once() -> None:
            try:
                async with self.table_lock:
                    electing = self.replicas.pending()  # their backups are asked first: not restored
                    owners = [None if pid in electing else o for pid, o in enumerate(self.table.owners)]
                    plan = placement.failover(owners, self.membership.statuses(), dead)
                    if plan is not None and dead in self.failovers and plan.new_owner:
                        await self._restore_elsewhere(dead, plan)
            except (RockstateError, OSError) as exc:
                log.warning("failover of %s's partitions failed (%s); retrying", dead, exc)
                self.event("failover_retry", node=dead, reason=str(exc))
                raise _NotYet() from exc
            if plan is None:  # no live node is not an error: it waits quietly
                raise _NotYet()

        await FAILOVER_RETRY.acall(once)
        if dead in self.failovers:
            self.failovers.discard(dead)
            await self._save()

    async def _restore_elsewhere(self, dead: str, plan: placement.FailoverPlan) -> None:
        chk = self.checkpoints.latest()
        if chk is not None:
            await self.checkpoints.restore_partitions(chk, [(self.peer(t), pids) for t, pids in plan.by_target().items()])
        for pid, node in plan.new_owner.items():  # recorded before the table: a crash in between repeats the failover
            self.event("partition_restored", partition=pid, checkpoint=chk, node=node, previous=dead)
        await self._publish(self.table.with_owners(plan.owners(self.table.owners), self.membership.addresses()))

    def partitions_by_node(self) -> list[tuple[Peer, list[int]]]:
        """Each live owner with the partitions it owns."""
        return [(self.peer(o), pids) for o, pids in placement.by_owner(self.table.owners, self.membership.statuses())]

    async def _move(self, move: placement.Move) -> None:
        """Move a partition (moves.py; with backups, handover.py); writes to it wait only from the freeze to the new table."""
        if self.replicas.enabled and move.source is not None:  # (None: a new cluster's first placement)
            await self.replicas.hand_over(move, self.membership.serving(move.source))
            return
        m = Migration(move.partition, move.source, move.target, source_serving=self.membership.serving(move.source),
                      live=self.config.live_migration)
        source = self.peer(move.source) if m.copies else None
        await self.replicas.before_move(move.partition, move.target)
        await run_move(m, source and source.rpc(self.security), self.peer(move.target).rpc(self.security),
                       source and source.address, lambda: self._commit_owner(m.partition, m.target), self.event)

    async def _commit_owner(self, pid: int, owner: str) -> None:
        """The new owner serves from the next epoch."""
        owners = list(self.table.owners)
        owners[pid] = owner
        await self._publish(self.table.with_owners(owners, self.membership.addresses()), include_leaving=True)

    async def _publish(self, table: Table, include_leaving: bool = False) -> None:
        """A new table: kept, then sent to the nodes (a leaving one too, while its partitions move off it)."""
        self.table, catch_ups = self.replicas.decorate(table)
        await self._save()
        await self._broadcast(p.ApplyTable(table=self.table.to_wire()), include_leaving)
        await self.replicas.carry_out(catch_ups)

    async def _broadcast(self, msg, include_leaving: bool = False) -> list:
        wanted = (MemberStatus.ALIVE, MemberStatus.LEAVING) if include_leaving else (MemberStatus.ALIVE,)
        return await self.peers.broadcast([m for m in self.members.values() if m.status in wanted], msg)

    # -- checkpoints ------------------------------------------------------------------

    async def checkpoint_request(self, msg, conn):
        if self.checkpoints is None:
            raise CheckpointsNotConfiguredError("this cluster has no checkpoint storage: start the coordinator with --checkpoints URL")
        answer = CHECKPOINT_REQUESTS[type(msg)](self.checkpoints, msg)
        return await answer if inspect.isawaitable(answer) else answer


async def run_coordinator(config: CoordinatorConfig) -> None:
    import signal

    coordinator = Coordinator(config)
    await coordinator.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await coordinator.stop()
