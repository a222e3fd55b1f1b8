"""The coordinator: membership, the partition table, the state catalog, cluster-wide answers.

A shell: it receives messages and carries out what the control plane's pure
objects decide. ``Coordinator`` builds its parts, each given what it uses, and
routes each message to one of them (``handlers``):

- ``membership.py`` (``control/membership.py``): registration, heartbeats, a graceful leave;
- ``placement.py`` (``control/placement.py``): the moves that balance the table
  (``migration.py``: ``control/migration.py``'s steps), a dead node's failover, each new table published;
- ``replication/in_sync.py`` (``control/in_sync.py``): replica sets, in-sync sets, promotions, handovers;
- ``answers.py``: the state catalog and cluster-wide answers (the status document of ``web/``);
- ``checkpoints.py``: the checkpoint driver, with each node as a participant;
- ``leadership.py`` (``control/leadership.py``): with several coordinators, it acts only while it leads.

Everything is persisted (``persistence.py``: ``<data_dir>/coordinator.json``,
or documents on ZooKeeper) before it is acted on, so a restarted coordinator
resumes with the same table (``state.py``: what it keeps).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import time
from typing import Any

from ...config import CoordinatorConfig
from ...errors import CheckpointsNotConfiguredError
from ...files import write_json
from ...rpc.messages import Message
from ...rpc.server import Connection, Handler, Server
from .web import StatusServer
from .. import datadir, protocol as p
from .answers import ClusterAnswers
from .checkpoints import ClusterCheckpoints
from .events import KEEP, EventLines
from .leadership import Election, Leading
from .membership import MemberHandlers
from .metrics import CoordinatorMetrics
from .peers import Peers
from .persistence import DataDirectory, ZooKeeperDocuments
from .placement import Placement
from .state import ClusterState, checkpoint_config
from .tasks import Tasks
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

BALANCE_CHECK = 5.0  # seconds between the monitor's checks that the table is balanced


class Coordinator:
    def __init__(self, config: CoordinatorConfig) -> None:
        self.config = config
        self.data_dir = os.path.abspath(config.data_dir)
        os.makedirs(self.data_dir, exist_ok=True)
        election = Election(config) if config.zookeeper else None
        self.persistence: DataDirectory | ZooKeeperDocuments = DataDirectory(self.data_dir)  # ZooKeeper's once it contends
        self.security = Security.from_config(config.security)
        self.tasks = Tasks()
        self.table_lock = asyncio.Lock()  # held while partitions move, and by checkpoints and restores
        self._saving = asyncio.Lock()  # one save at a time (_save)
        self._save_requests = self._saves_done = 0
        self.state = ClusterState(Table.empty(config.partitions), self.persistence.events)  # the record: _load
        self.peers = Peers(self.security, self.state.member)
        self.checkpoints: ClusterCheckpoints | None = None  # the record's, from _load
        # the replica control and the placement call each other (a promotion publishes a table; a table decorated
        # with the replica sets): the replica control is given the placement's publish and restore_lost late-bound
        self.replicas = ReplicaControl(
            config, publish=lambda owners: self.placement.publish_owners(owners), statuses=self.state.statuses,
            channel=self.peers.channel, address=self.peers.address, restore_lost=lambda dead: self.placement.restore_lost(dead),
            spawn=self.tasks.spawn, event=self.event)
        self.placement = Placement(config, self.state, self.replicas, self.peers, lock=self.table_lock,
                                   checkpoints=lambda: self.checkpoints, save=self._save, event=self.event,
                                   spawn=self.tasks.spawn)
        self.member_handlers = MemberHandlers(config, self.state, self.replicas, self.peers, lock=self.table_lock,
                                              rebalance=self.placement.rebalance, declare_dead=self.placement.declare_dead,
                                              save=self._save, event=self.event, spawn=self.tasks.spawn)
        self.leading = Leading(election, address=lambda: self.address, load=lambda: self.persistence.load(),
                               take_up=self._load, prepare=self.placement.prepare, begin=self._begin,
                               spawn=self.tasks.spawn, stop_tasks=self.tasks.cancel, elected_event=self._elected)
        self.metrics = CoordinatorMetrics(self.state, lambda: self.checkpoints)
        self.event_lines = EventLines()  # its log lines: routine per-partition events summed per burst
        self.answers = ClusterAnswers(config, self.state, self.replicas, self.peers, self.metrics,
                                      checkpoints=lambda: self.checkpoints, owned=self.placement.partitions_by_node,
                                      broadcast=self.placement.broadcast, save=self._save,
                                      coordinators=self.leading.coordinators)
        self._load(self.persistence.load() if election is None else {})
        self.web = StatusServer(self.security, self.metrics.registry, leading=lambda: self.leading.leading,
                                status=self.answers.document, coordinators=self.leading.coordinators,
                                events=lambda: self.state.events.latest(KEEP), load=self.answers.load_document)
        self.server = Server(self.leading.leader_only(self.handlers()), config.host, config.port, name="coordinator",
                             ssl=self.security.server_ssl, secret=self.security.secret)

    def handlers(self) -> dict[type, Handler]:
        """Every message the coordinator answers, and the part that answers it."""
        answers, members = self.answers, self.member_handlers
        return {
            p.Register: members.register,
            p.Heartbeat: members.heartbeat,
            p.Leave: members.leave,
            p.Undrain: members.undrain,
            p.RemoveMember: members.remove,
            p.GetTable: answers.get_table,
            p.DefineState: answers.define_state,
            p.ClusterStats: answers.cluster_stats,
            p.Count: answers.count,
            p.Status: answers.status,
            p.Events: answers.events_after,
            p.PipelineProgress: answers.pipeline_progress,
            p.ReplicaReport: self.replicas.report,
            **dict.fromkeys(CHECKPOINT_REQUESTS, self.checkpoint_request),
        }

    def _load(self, saved: dict) -> None:
        """Take up a saved record ({}: a new cluster)."""
        self.state.take_up(self.config, saved, self.persistence.events)
        self.replicas.load(saved, self.state.table.owners)  # replica sets and in-sync sets
        config = checkpoint_config(self.config)
        self.checkpoints = ClusterCheckpoints(
            config, self.state.table.partitions, lock=self.table_lock, owners=self.placement.partitions_by_node,
            channel=lambda peer: peer.rpc(self.security), specs=lambda: self.state.specs,
            define=self.answers.define, event=self.event, keys=self.security.checkpoint_keys) if config else None
        # a new cluster on a storage that holds checkpoints starts from the latest one
        self.placement.load(restore_on_start=not saved and self.checkpoints is not None)

    @property
    def address(self) -> str:
        return self.server.address

    async def _save(self) -> None:
        """Return once the record as of this call (or a newer one) is kept. Saves run one at a time; the requests
        made while one runs are covered together by the next (a group commit): one save per burst of changes."""
        self._save_requests += 1
        mine = self._save_requests
        async with self._saving:
            if self._saves_done >= mine:
                return  # a save that began after this request kept it
            upto = self._save_requests
            await self.persistence.save({**self.state.record(), **self.replicas.to_wire()})  # "replicas" and "zones"
            self._saves_done = max(self._saves_done, upto)

    def event(self, event: str, **data: Any) -> None:
        """Record a cluster event (member joined/left/dead, migration, partition restored, checkpoint...)."""
        self.state.events.append(event, **data)
        self.metrics.observe(event, data)
        self.event_lines.log(event, data)

    def _elected(self) -> None:
        self.event("coordinator_elected", coordinator=self.address, epoch=self.state.table.epoch)

    # -- life cycle --------------------------------------------------------

    async def start(self) -> None:
        self._dir_lock = datadir.lock(self.data_dir, "coordinator")  # before it serves: a second one must not
        self.metrics.loop_lag.start()
        election = self.leading.election
        if election is None:
            await self.placement.prepare()
            self._begin()
        await self.server.start()
        if election is not None:  # it leads once elected (Leading.elected)
            self.persistence = await election.start(self.address, self.leading)
        status_url = None if self.config.http_port is None else await self.web.start(self.config.host, self.config.http_port)
        write_json(os.path.join(self.data_dir, "address.json"), {"address": self.address, "pid": os.getpid(), "status_url": status_url})
        log.info("coordinator serving on %s with %d partitions", self.address, self.state.table.partitions)

    def _begin(self) -> None:
        """Lead: the tasks of the coordinator in charge (monitor, resumption, periodic checkpoints, the nodes' load)."""
        self.tasks.spawn(self._monitor())
        self.tasks.spawn(self.answers.sample_load())
        if self.state.membership.members:
            self.tasks.spawn(self.placement.resume())
        else:
            self.placement.resumed.set()
        if self.checkpoints is not None and self.checkpoints.config.interval:
            self.tasks.spawn(self.checkpoints.periodic())

    async def stop(self) -> None:
        self.event_lines.flush()
        self.metrics.loop_lag.stop()
        await self.tasks.stop()
        if self.leading.election is not None:
            await self.leading.election.stop()
        await self.server.stop()
        await self.web.stop()
        await self.peers.close()
        datadir.release(getattr(self, "_dir_lock", None))

    async def _monitor(self) -> None:
        """Members that went silent declared dead; replicas kept at ``backup_count``; the table kept balanced."""
        last_ensure = last_balance = time.monotonic()
        while True:
            await asyncio.sleep(min(0.25, self.config.heartbeat_timeout / 4))
            for m in self.state.membership.expire(time.monotonic()):
                await self.placement.declare_dead(m.node_id)
            if time.monotonic() - last_ensure > 1.0:
                last_ensure = time.monotonic()
                self.tasks.spawn(self.replicas.ensure())  # backups added, dropped, caught up anew
            if time.monotonic() - last_balance > BALANCE_CHECK and self.placement.unbalanced():
                last_balance = time.monotonic()
                # redone here, not only on a membership change: a move or a welcome-back that failed would
                # otherwise leave a node without its share until the next join or death
                self.tasks.spawn(self.placement.rebalance())

    async def checkpoint_request(self, msg: Message, conn: Connection) -> Any:
        if self.checkpoints is None:
            raise CheckpointsNotConfiguredError("this cluster has no checkpoint storage: start the coordinator with --checkpoints URL")
        await self.member_handlers.tell_storage()  # nodes registered before the storage was set learn it first
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
