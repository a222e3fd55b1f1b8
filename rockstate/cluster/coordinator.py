"""The coordinator: membership, the partition table, the state catalog, cluster-wide answers.

Membership. A node registers (a new id, or its old one after a restart) and
heartbeats; one silent for ``heartbeat_timeout`` is declared dead. A dead
node keeps its partitions (they are unavailable until it returns): moving
them elsewhere without their data would lose it.

Table changes. A join or a graceful leave computes a balanced table
(``assignment.assign``) and moves each partition whose owner changes, at most
``max_concurrent_migrations`` at once (see ``migration``); every finished move
is its own epoch. Everything is persisted in ``<data_dir>/coordinator.json``,
so a restarted coordinator resumes with the same table.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass

from ..config import CheckpointConfig, CoordinatorConfig
from ..errors import CheckpointsNotConfiguredError, ClusterError, PartitionUnavailableError, RockstateError, UnknownNodeError
from ..rpc.client import AsyncChannel
from ..rpc.server import Server
from ..store import StateSpec
from ..store.catalog import unknown_state
from ..store.store import read_json, write_json
from . import protocol as p
from ..control.assignment import assign
from .checkpointing import ClusterCheckpoints
from .events import EventLog
from .security import Security
from .table import Table

log = logging.getLogger(__name__)


@dataclass
class Member:
    node_id: str
    address: str
    status: str = "alive"  # alive | dead | left
    last_seen: float = 0.0  # time.monotonic()
    channel: AsyncChannel | None = None

    def rpc(self, security: Security) -> AsyncChannel:
        if self.channel is None or self.channel.address != self.address:
            self.channel = AsyncChannel(self.address, name="coordinator", timeout=60.0,
                                        ssl=security.client_ssl, secret=security.secret)
        return self.channel


class Coordinator:
    def __init__(self, config: CoordinatorConfig) -> None:
        self.config = config
        self.data_dir = os.path.abspath(config.data_dir)
        os.makedirs(self.data_dir, exist_ok=True)
        saved = read_json(self._state_path) or {}
        self.table = Table.from_wire(saved["table"]) if saved else Table.empty(config.partitions)
        self.specs = {d["name"]: StateSpec.from_dict(d) for d in saved.get("states", [])}
        now = time.monotonic()  # a restarted coordinator gives every node a full timeout to check in
        self.members = {nid: Member(nid, m["address"], m["status"], now) for nid, m in saved.get("members", {}).items()}
        self._next_id = saved.get("next_id", 1)
        self.pipelines: dict[str, dict] = saved.get("pipelines", {})
        self.failovers: set[str] = set(saved.get("failovers", []))  # dead nodes whose partitions are not restored yet
        self.events = EventLog(os.path.join(self.data_dir, "events.jsonl"))
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
            p.TriggerCheckpoint: self.trigger_checkpoint,
            p.ListCheckpoints: self.list_checkpoints,
            p.RestoreCluster: self.restore_cluster,
            p.CreateSavepoint: self.create_savepoint,
            p.ListSavepoints: self.list_savepoints,
            p.InspectCheckpoint: self.inspect_checkpoint,
        }
        self.security = Security.from_config(config)
        self.checkpoints = ClusterCheckpoints(self, self.checkpoint_config) if config.checkpoints else None
        # a new cluster on a storage that holds checkpoints starts from the latest one
        self._restore_on_start = not saved and self.checkpoints is not None  # and it holds one: see start()
        self.server = Server(self.handlers, config.host, config.port, name="coordinator",
                             ssl=self.security.server_ssl, secret=self.security.secret)
        self.table_lock = asyncio.Lock()  # held while partitions move, and by checkpoints and restores
        self._tasks: set[asyncio.Task] = set()

    @property
    def checkpoint_config(self) -> CheckpointConfig:
        c = self.config
        return CheckpointConfig(url=c.checkpoints, cluster=c.cluster_name, retained=c.retained_checkpoints,
                                interval=c.checkpoint_interval, timeout=c.checkpoint_timeout)

    @property
    def _state_path(self) -> str:
        return os.path.join(self.data_dir, "coordinator.json")

    @property
    def address(self) -> str:
        return self.server.address

    def _save(self) -> None:
        write_json(self._state_path, {
            "table": self.table.to_wire(),
            "states": [s.to_dict() for s in self.specs.values()],
            "members": {m.node_id: {"address": m.address, "status": m.status} for m in self.members.values()},
            "next_id": self._next_id,
            "pipelines": self.pipelines,
            "failovers": sorted(self.failovers),
        })

    def event(self, event: str, **data) -> None:
        """Record a cluster event (member joined/left/dead, migration, partition restored, checkpoint...)."""
        self.events.append(event, **data)
        log.info("event %s %s", event, data)

    async def events_after(self, msg: p.Events, conn) -> list:
        return await self.events.wait_after(msg.after, msg.wait)

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- life cycle --------------------------------------------------------

    async def start(self) -> None:
        if self.checkpoints is not None:
            await self.checkpoints.open()
            self._restore_on_start = self._restore_on_start and self.checkpoints.latest() is not None
        await self.server.start()
        self._spawn(self._monitor())
        if self.members:
            self._spawn(self._resume())
        if self.checkpoints is not None and self.config.checkpoint_interval:
            self._spawn(self.checkpoints.periodic())
        write_json(os.path.join(self.data_dir, "address.json"), {"address": self.address, "pid": os.getpid()})
        log.info("coordinator serving on %s with %d partitions", self.address, self.table.partitions)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.server.stop()
        for m in self.members.values():
            if m.channel is not None:
                await m.channel.close()

    async def _resume(self) -> None:
        """After a restart: once the nodes have checked in, clear what moves in flight left, and rebalance.

        A move interrupted by the crash never changed the table (it changes
        last), so its source still owns the partition: thawing it and
        dropping the copies rolls the move back; the rebalance redoes it.
        """
        started = time.monotonic()
        while time.monotonic() - started < self.config.heartbeat_timeout:
            if all(m.last_seen > started for m in self.alive()):
                break
            await asyncio.sleep(0.05)
        async with self.table_lock:
            await self._broadcast(p.Thaw())
            # a new epoch: a source that let go of a partition just before the crash takes it back
            self.table = self.table.with_addresses({m.node_id: m.address for m in self.members.values()})
            self._save()
            await self._broadcast(p.ApplyTable(table=self.table.to_wire()))
        self.event("coordinator_resumed", epoch=self.table.epoch)
        for node_id in self.failovers:  # a failover the crash interrupted is done now
            self._spawn(self._failover(node_id))
        await self._rebalance()

    async def _monitor(self) -> None:
        while True:
            await asyncio.sleep(min(0.25, self.config.heartbeat_timeout / 4))
            now = time.monotonic()
            for m in self.members.values():
                if m.status == "alive" and now - m.last_seen > self.config.heartbeat_timeout:
                    m.status = "dead"
                    self.event("member_dead", node=m.node_id, address=m.address)
                    if self.checkpoints is not None:
                        self.failovers.add(m.node_id)
                        self._spawn(self._failover(m.node_id))
                    self._save()

    def alive(self) -> list[Member]:
        return [m for m in self.members.values() if m.status == "alive"]

    # -- membership ------------------------------------------------------------

    async def register(self, msg: p.Register, conn) -> dict:
        node_id = msg.node_id
        if node_id is None or node_id not in self.members:
            if node_id is None:
                node_id = f"node-{self._next_id}"
                self._next_id += 1
            self.members[node_id] = Member(node_id, msg.address)
            self.event("member_joined", node=node_id, address=msg.address)
        else:
            self.event("member_returned", node=node_id, address=msg.address)
        member = self.members[node_id]
        member.address, member.status, member.last_seen = msg.address, "alive", time.monotonic()
        addresses = {m.node_id: m.address for m in self.members.values()}
        if addresses != self.table.addresses:
            self.table = self.table.with_addresses(addresses)
        self._save()
        self._spawn(self._rebalance())
        return {
            "node_id": node_id,
            "partitions": self.table.partitions,
            "table": self.table.to_wire(),
            "states": [s.to_dict() for s in self.specs.values()],
            "limits": {"max_key_bytes": self.config.max_key_bytes, "max_value_bytes": self.config.max_value_bytes},
            "heartbeat_timeout": self.config.heartbeat_timeout,  # the node's lease is half of it
            "checkpoints": self.checkpoint_config.model_dump() if self.checkpoints else None,
        }

    async def heartbeat(self, msg: p.Heartbeat, conn) -> int:
        member = self.members.get(msg.node_id)
        if member is None or member.status == "left":
            raise UnknownNodeError(f"node {msg.node_id} is not a member; register again")
        if member.status == "dead":  # it was cut off, not gone: partitions restored elsewhere meanwhile stay there
            member.status = "alive"
            self.event("member_returned", node=member.node_id, address=member.address)
            self._save()
            self._spawn(self._welcome_back(member))
        member.last_seen = time.monotonic()
        return self.table.epoch

    async def _welcome_back(self, member: Member) -> None:
        """A node back from being cut off learns the current table (it drops what was restored elsewhere), then gets its share."""
        async with self.table_lock:
            await member.rpc(self.security).call(p.ApplyTable(table=self.table.to_wire()))
        await self._rebalance()

    async def leave(self, msg: p.Leave, conn) -> dict:
        member = self.members.get(msg.node_id)
        if member is None:
            raise UnknownNodeError(f"node {msg.node_id} is not a member")
        others = [m for m in self.alive() if m.node_id != msg.node_id]
        if not others:  # nobody to take its partitions: they wait on its disk for its return
            member.status = "dead"
            self.event("member_stopped", node=member.node_id, reason="last node; partitions stay on its disk")
            self._save()
            return {"moved": 0}
        member.status = "leaving"
        moved = await self._rebalance()
        member.status = "left"
        self.event("member_left", node=member.node_id)
        self._save()
        return {"moved": moved}

    # -- the table -----------------------------------------------------------

    async def get_table(self, msg: p.GetTable, conn) -> dict:
        return {**self.table.to_wire(), "limits": {"max_key_bytes": self.config.max_key_bytes, "max_value_bytes": self.config.max_value_bytes}}

    async def _rebalance(self) -> int:
        """Move partitions until the table is balanced over the live nodes; returns how many moved.

        Partitions of dead nodes stay where they are: they wait for their node.
        """
        async with self.table_lock:
            targets = [m.node_id for m in self.alive()]
            if not targets:
                return 0
            owners = self.table.owners
            movable = [pid for pid, o in enumerate(owners) if o is None or self.members[o].status != "dead"]
            current = [owners[pid] if owners[pid] in targets else None for pid in movable]
            planned = [(pid, owners[pid], new) for pid, new in zip(movable, assign(current, targets)) if new != owners[pid]]
            limit = asyncio.Semaphore(self.config.max_concurrent_migrations)

            async def one(pid, source, target):
                async with limit:
                    await self._move(pid, source, target)

            await asyncio.gather(*(one(*mv) for mv in planned))
            if self._restore_on_start and None not in self.table.owners:
                self._restore_on_start = False
                chk = self.checkpoints.latest()
                await self.checkpoints.restore_partitions(chk, self.partitions_by_node())
                self.event("cluster_restored", checkpoint=chk, reason="new cluster on a storage with checkpoints")
            return len(planned)

    async def _failover(self, dead: str) -> None:
        """Give a dead node's partitions to the live nodes, restored from the latest completed checkpoint.

        What was written to them after that checkpoint is lost; the
        ``partition_restored`` events name the checkpoint so a pipeline can
        rewind to it and replay. A failed restore (storage or a target node
        failing) is retried until it works or the node comes back: until
        then its partitions are unavailable, never served from an older state.
        """
        delay = 0.2
        while dead in self.failovers:
            try:
                if await self._failover_once(dead):
                    self.failovers.discard(dead)
                    self._save()
                    return
            except (RockstateError, OSError) as exc:  # no live node is not an error: it waits quietly
                log.warning("failover of %s's partitions failed (%s); retrying in %.1fs", dead, exc, delay)
                self.event("failover_retry", node=dead, reason=str(exc))
            await asyncio.sleep(delay)
            delay = min(2 * delay, 5.0)

    async def _failover_once(self, dead: str) -> bool:
        """One try; False when there is no live node to restore to."""
        async with self.table_lock:
            targets = [m.node_id for m in self.alive()]
            lost = self.table.owned_by(dead)
            if not lost or self.members[dead].status != "dead":
                return True  # nothing left to restore, or the node came back with its data
            if not targets:
                return False
            owners = list(self.table.owners)
            current = [o if o in targets else None for o in owners]
            wanted = assign(current, targets)
            chk = self.checkpoints.latest()
            by_target: dict[str, list[int]] = {}
            for pid in lost:
                by_target.setdefault(wanted[pid], []).append(pid)
            if chk is not None:
                await self.checkpoints.restore_partitions(chk, [(self.members[t], pids) for t, pids in by_target.items()])
            for pid in lost:  # recorded before the table: a crash in between repeats the failover, never hides it
                self.event("partition_restored", partition=pid, checkpoint=chk, node=wanted[pid], previous=dead)
                owners[pid] = wanted[pid]
            self.table = self.table.with_owners(owners, {m.node_id: m.address for m in self.members.values()})
            self._save()
            await self._broadcast(p.ApplyTable(table=self.table.to_wire()))
            return True

    def partitions_by_node(self) -> list[tuple[Member, list[int]]]:
        """Each live owner with the partitions it owns."""
        by_node: dict[str, list[int]] = {}
        for pid, owner in enumerate(self.table.owners):
            by_node.setdefault(owner, []).append(pid)
        missing = [pid for o, pids in by_node.items() if o is None or self.members[o].status != "alive" for pid in pids]
        if missing:
            raise PartitionUnavailableError(f"partitions {missing[:8]} have no live owner", partitions=missing[:64])
        return [(self.members[o], pids) for o, pids in by_node.items()]

    async def _move(self, pid: int, source: str | None, target: str) -> None:
        """Move a partition (see moves.py); writes to it wait only from the freeze to the new table."""
        src = self.members.get(source) if source else None
        if src is None or src.status not in ("alive", "leaving"):
            await self._commit_owner(pid, target)  # nothing to copy: unassigned, or its node is gone
            return
        dst, security = self.members[target], self.security
        self.event("migration_started", partition=pid, source=source, target=target)
        started = time.monotonic()
        try:
            if not self.config.live_migration:  # the old way, kept as the benchmark's baseline
                await src.rpc(security).call(p.Freeze(partition=pid))
            copied = await dst.rpc(security).call(p.Pull(partition=pid, source=src.address), timeout=3600.0)
            await src.rpc(security).call(p.Freeze(partition=pid))
            frozen = time.monotonic()
            delta = await dst.rpc(security).call(p.PullDelta(partition=pid, source=src.address), timeout=600.0)
        except BaseException:
            await asyncio.gather(src.rpc(security).call(p.Freeze(partition=pid, frozen=False)),
                                 src.rpc(security).call(p.MoveDiscard(partition=pid)),
                                 dst.rpc(security).call(p.PullDiscard(partition=pid)), return_exceptions=True)
            self.event("migration_failed", partition=pid, source=source, target=target)
            raise
        await self._commit_owner(pid, target)
        finished = time.monotonic()
        self.event("migration_finished", partition=pid, source=source, target=target, bytes=copied, delta_ops=delta,
                   seconds=round(finished - started, 4),
                   write_blocked_seconds=round(finished - (started if not self.config.live_migration else frozen), 4))

    async def _commit_owner(self, pid: int, owner: str) -> None:
        """The new owner serves from the next epoch. The old owner lets go first, before the table
        changes, so no two nodes ever serve the partition at once (no stale read from the old one)."""
        previous = self.members.get(self.table.owners[pid])
        if previous is not None and previous.node_id != owner and previous.status in ("alive", "leaving"):
            try:
                await previous.rpc(self.security).call(p.Release(partition=pid))
            except RockstateError as e:  # unreachable: it learns of the new table by its next heartbeat
                log.warning("could not make %s let go of partition %d: %s", previous.node_id, pid, e)
        owners = list(self.table.owners)
        owners[pid] = owner
        self.table = self.table.with_owners(owners, {m.node_id: m.address for m in self.members.values()})
        self._save()
        await self._broadcast(p.ApplyTable(table=self.table.to_wire()), include_leaving=True)

    async def _broadcast(self, msg, include_leaving: bool = False) -> list:
        targets = [m for m in self.members.values() if m.status == "alive" or (include_leaving and m.status == "leaving")]
        results = await asyncio.gather(*(m.rpc(self.security).call(msg) for m in targets), return_exceptions=True)
        for m, r in zip(targets, results):
            if isinstance(r, BaseException):
                log.warning("%s to %s failed: %s", msg.op, m.node_id, r)
        return list(zip(targets, results))

    # -- states and cluster-wide answers ---------------------------------------------

    async def define_state(self, msg: p.DefineState, conn) -> dict:
        return (await self.define(StateSpec.from_dict(msg.spec))).to_dict()

    async def define(self, spec: StateSpec) -> StateSpec:
        existing = self.specs.get(spec.name)
        if existing is not None:
            existing.check_same(spec)
            return existing
        self.specs[spec.name] = spec
        self._save()
        await self._broadcast(p.NodeDefineState(spec=spec.to_dict()))
        return spec

    async def _ask_all(self, msg) -> list[tuple[Member, object]]:
        answers = await self._broadcast(msg)
        for m, r in answers:
            if isinstance(r, BaseException):
                raise ClusterError(f"node {m.node_id} at {m.address} did not answer {msg.op}: {r}")
        return answers

    async def count(self, msg: p.Count, conn) -> int:
        if msg.state not in self.specs:
            raise unknown_state(msg.state)
        return sum(n for _, n in await self._ask_all(p.NodeCount(state=msg.state)))

    async def cluster_stats(self, msg: p.ClusterStats, conn) -> dict:
        states = {n: {"kind": s.kind, "ttl": s.ttl, "keys": 0, "bytes": 0} for n, s in self.specs.items()}
        nodes, partitions = {}, {}
        for member, answer in await self._ask_all(p.NodeStats()):
            for name, row in answer["states"].items():
                states.setdefault(name, {"kind": row["kind"], "ttl": row["ttl"], "keys": 0, "bytes": 0})
                states[name]["keys"] += row["keys"]
                states[name]["bytes"] += row["bytes"]
            node_row = {"partitions": len(answer["partitions"]), "keys": 0, "bytes": 0}
            for pid, row in answer["partitions"].items():
                partitions[int(pid)] = {**row, "node": member.node_id}
                node_row["keys"] += row["keys"]
                node_row["bytes"] += row["bytes"]
            nodes[member.node_id] = node_row
        return {"states": states, "nodes": nodes, "partitions": partitions}

    # -- checkpoints ------------------------------------------------------------------

    def _checkpoints(self) -> ClusterCheckpoints:
        if self.checkpoints is None:
            raise CheckpointsNotConfiguredError("this cluster has no checkpoint storage: start the coordinator with --checkpoints URL")
        return self.checkpoints

    async def trigger_checkpoint(self, msg: p.TriggerCheckpoint, conn) -> dict:
        return await self._checkpoints().checkpoint()

    async def list_checkpoints(self, msg: p.ListCheckpoints, conn) -> list:
        return self._checkpoints().history()

    async def restore_cluster(self, msg: p.RestoreCluster, conn) -> dict:
        return await self._checkpoints().restore(msg.checkpoint, msg.savepoint)

    async def create_savepoint(self, msg: p.CreateSavepoint, conn) -> dict:
        return await self._checkpoints().savepoint(msg.name, msg.checkpoint)

    async def inspect_checkpoint(self, msg: p.InspectCheckpoint, conn) -> dict:
        return await self._checkpoints().inspect(msg.checkpoint)

    async def list_savepoints(self, msg: p.ListSavepoints, conn) -> list:
        return await self._checkpoints().savepoints()

    async def pipeline_progress(self, msg: p.PipelineProgress, conn) -> None:
        self.pipelines[msg.record["query"]] = {**msg.record, "batches": msg.record.get("batches", [])[-5:]}
        self._save()

    async def status(self, msg: p.Status, conn) -> dict:
        now = time.monotonic()
        counts = {}
        for owner in self.table.owners:
            counts[owner] = counts.get(owner, 0) + 1
        return {
            "epoch": self.table.epoch,
            "partitions": self.table.partitions,
            "unassigned": counts.get(None, 0),
            "states": len(self.specs),
            "nodes": [
                {"node_id": m.node_id, "address": m.address, "status": m.status,
                 "partitions": counts.get(m.node_id, 0), "last_seen": round(now - m.last_seen, 2)}
                for m in sorted(self.members.values(), key=lambda m: m.node_id)
            ],
            "events": self.events.latest(100),
            "pipelines": sorted(self.pipelines.values(), key=lambda r: -r.get("updated", 0)),
            "checkpoints": None if self.checkpoints is None else {
                "url": self.config.checkpoints, "latest": self.checkpoints.latest(), "recent": self.checkpoints.history()[-5:]},
        }


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
