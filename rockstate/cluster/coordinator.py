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
from collections import deque
from dataclasses import dataclass

from ..config import CoordinatorConfig
from ..errors import ClusterError, RockstateError, UnknownNodeError, UnknownStateError
from ..rpc.client import AsyncChannel
from ..rpc.server import Server
from ..store import StateSpec
from ..store.store import read_json, write_json
from . import protocol as p
from .assignment import assign
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
        self.events: deque[dict] = deque(maxlen=200)
        self.handlers = {
            p.Register: self.register,
            p.Heartbeat: self.heartbeat,
            p.Leave: self.leave,
            p.GetTable: self.get_table,
            p.DefineState: self.define_state,
            p.ClusterStats: self.cluster_stats,
            p.Count: self.count,
            p.Status: self.status,
        }
        self.security = Security.from_config(config)
        self.server = Server(self.handlers, config.host, config.port, name="coordinator",
                             ssl=self.security.server_ssl, secret=self.security.secret)
        self._rebalance_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()

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
        })

    def _event(self, event: str, **data) -> None:
        self.events.append({"time": time.time(), "event": event, **data})
        log.info("event %s %s", event, data)

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- life cycle --------------------------------------------------------

    async def start(self) -> None:
        await self.server.start()
        self._spawn(self._monitor())
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

    async def _monitor(self) -> None:
        while True:
            await asyncio.sleep(min(0.25, self.config.heartbeat_timeout / 4))
            now = time.monotonic()
            for m in self.members.values():
                if m.status == "alive" and now - m.last_seen > self.config.heartbeat_timeout:
                    m.status = "dead"
                    self._event("member_dead", node=m.node_id, address=m.address)
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
            self._event("member_joined", node=node_id, address=msg.address)
        else:
            self._event("member_returned", node=node_id, address=msg.address)
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
        }

    async def heartbeat(self, msg: p.Heartbeat, conn) -> int:
        member = self.members.get(msg.node_id)
        if member is None or member.status == "left":
            raise UnknownNodeError(f"node {msg.node_id} is not a member; register again")
        if member.status == "dead":
            member.status = "alive"
            self._event("member_returned", node=member.node_id, address=member.address)
            self._save()
        member.last_seen = time.monotonic()
        return self.table.epoch

    async def leave(self, msg: p.Leave, conn) -> dict:
        member = self.members.get(msg.node_id)
        if member is None:
            raise UnknownNodeError(f"node {msg.node_id} is not a member")
        others = [m for m in self.alive() if m.node_id != msg.node_id]
        if not others:  # nobody to take its partitions: they wait on its disk for its return
            member.status = "dead"
            self._event("member_stopped", node=member.node_id, reason="last node; partitions stay on its disk")
            self._save()
            return {"moved": 0}
        member.status = "leaving"
        moved = await self._rebalance()
        member.status = "left"
        self._event("member_left", node=member.node_id)
        self._save()
        return {"moved": moved}

    # -- the table -----------------------------------------------------------

    async def get_table(self, msg: p.GetTable, conn) -> dict:
        return {**self.table.to_wire(), "limits": {"max_key_bytes": self.config.max_key_bytes, "max_value_bytes": self.config.max_value_bytes}}

    async def _rebalance(self) -> int:
        """Move partitions until the table is balanced over the live nodes; returns how many moved.

        Partitions of dead nodes stay where they are: they wait for their node.
        """
        async with self._rebalance_lock:
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
            return len(planned)

    async def _move(self, pid: int, source: str | None, target: str) -> None:
        src = self.members.get(source) if source else None
        if src is not None and src.status in ("alive", "leaving"):
            self._event("migration_started", partition=pid, source=source, target=target)
            started = time.monotonic()
            await src.rpc(self.security).call(p.Freeze(partition=pid))
            try:
                copied = await self.members[target].rpc(self.security).call(p.Pull(partition=pid, source=src.address), timeout=600.0)
            except RockstateError:
                await src.rpc(self.security).call(p.Freeze(partition=pid, frozen=False))
                raise
            await self._commit_owner(pid, target, dict(
                event="migration_finished", partition=pid, source=source, target=target, bytes=copied,
                seconds=round(time.monotonic() - started, 4)))
        else:
            await self._commit_owner(pid, target)

    async def _commit_owner(self, pid: int, owner: str, event: dict | None = None) -> None:
        owners = list(self.table.owners)
        owners[pid] = owner
        self.table = self.table.with_owners(owners, {m.node_id: m.address for m in self.members.values()})
        self._save()
        if event:
            self._event(**event)
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
        spec = StateSpec.from_dict(msg.spec)
        existing = self.specs.get(spec.name)
        if existing is not None:
            existing.check_same(spec)
            return existing.to_dict()
        self.specs[spec.name] = spec
        self._save()
        await self._broadcast(p.NodeDefineState(spec=spec.to_dict()))
        return spec.to_dict()

    async def _ask_all(self, msg) -> list[tuple[Member, object]]:
        answers = await self._broadcast(msg)
        for m, r in answers:
            if isinstance(r, BaseException):
                raise ClusterError(f"node {m.node_id} at {m.address} did not answer {msg.op}: {r}")
        return answers

    async def count(self, msg: p.Count, conn) -> int:
        if msg.state not in self.specs:
            raise UnknownStateError(f"unknown state {msg.state!r}")
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
            "events": list(self.events)[-100:],
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
