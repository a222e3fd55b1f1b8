"""The coordinator's side of ``control/membership.py``: a node's registration, heartbeats and graceful leave; the
watch for suspect members (silent for a third of ``heartbeat_timeout``: events ``member_suspect``, ``member_recovered``);
the checkpoint storage told to every member once per leadership (``tell_storage``): a node learns it at registration,
so one registered before this coordinator's storage was set or changed is told at its next heartbeat, or before a
checkpoint request is answered.

``MemberHandlers`` serves them; who is alive is ``control/membership.py``'s
``Membership`` (in ``ClusterState``); what a join, a return or a leave moves
is the placement's (``placement.py``) and the replica control's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, Coroutine

from ...config import CoordinatorConfig
from ...control.membership import MemberStatus
from ...errors import PartitionUnavailableError, RockstateError
from ...retry import Retry
from ...rpc.server import Connection
from .. import protocol as p
from .peers import Peers
from .state import ClusterState, checkpoint_config, limits, node_settings
from ..identity import refuse_takeover
from ..replication.in_sync import ReplicaControl

log = logging.getLogger(__name__)

WATCH_EVERY = 0.25  # seconds between looks for suspect members (at most a twelfth of heartbeat_timeout)
WELCOME_RETRY = Retry(deadline=10.0, initial=0.2, maximum=2.0)
# a graceful leave's rounds of moves, until the leaving node holds no primary: a round that failed (a handover that
# timed out on a loaded machine) or left it a partition (a backup of a dead primary promoted to it) is planned again
LEAVE_RETRY = Retry(deadline=120.0, initial=0.5, maximum=5.0, retry_on=lambda e: isinstance(e, (RockstateError, OSError)))


class MemberHandlers:
    def __init__(self, config: CoordinatorConfig, state: ClusterState, replicas: ReplicaControl, peers: Peers, *,
                 lock: asyncio.Lock, rebalance: Callable[[], Coroutine[Any, Any, int]], declare_dead: Callable[..., Awaitable[None]],
                 save: Callable[[], Awaitable[None]], event: Callable[..., None], spawn: Callable[[Coroutine], None]) -> None:
        """``lock``: the table's (a returning node gets the table under it); ``rebalance()``: moves planned and carried out,
        answering how many; ``declare_dead(node, **why)``; ``save()``, ``event(name, **data)``, ``spawn(coro)``."""
        self.config, self.state, self.replicas, self.peers, self.lock = config, state, replicas, peers, lock
        self._rebalance, self._declare_dead = rebalance, declare_dead
        self._save, self._event, self._spawn = save, event, spawn
        self._watch_every = min(WATCH_EVERY, config.heartbeat_timeout / 12)
        self._watched_at = float("-inf")  # the watch's last look (watch_suspects)
        self._watch_generation = 0  # the running watch's; an older one stops
        self._told: set[str] = set()  # members given this coordinator's checkpoint storage (registration or tell_storage)
        self._telling: dict[str, asyncio.Future] = {}
        self._untold: set[str] = set()  # members a push failed for (logged once)

    async def register(self, msg: p.Register, conn: Connection) -> dict:
        state = self.state
        if msg.node_id in state.membership.members:
            await refuse_takeover(state.membership.members[msg.node_id], msg.address, self.peers.security)
        node_id, joined = state.membership.register(msg.node_id, msg.address, time.monotonic())
        self._watching(time.monotonic())
        checkpoints = checkpoint_config(self.config)
        state.membership[node_id].checkpoint_url = checkpoints.url or "" if checkpoints else ""  # what it learns below
        state.membership[node_id].settings = node_settings(self.config)  # as is the reply's
        self._told.add(node_id)
        if msg.zone:
            self.replicas.zones[node_id] = msg.zone
        self._event("member_joined" if joined else "member_returned", node=node_id, address=msg.address)
        if state.membership.addresses() != state.table.addresses:
            state.table = state.table.with_addresses(state.membership.addresses())
        await self._save()
        self._spawn(self.replicas.returned(node_id))  # restarted before its partitions got a new primary: they are its again
        self._spawn(self._rebalance())
        return {
            "node_id": node_id,
            "partitions": state.table.partitions,
            "table": state.table.to_wire(),
            "states": [s.to_dict() for s in state.specs.values()],
            "limits": limits(self.config),
            "heartbeat_timeout": self.config.heartbeat_timeout,  # the node's lease is half of it
            "checkpoints": checkpoints.model_dump() if checkpoints else None,
        }

    def _watching(self, now: float) -> None:
        """The watch for suspects runs while this coordinator leads: the first registration or heartbeat it serves
        (only a leader serves them) starts it; one that stopped with the leader's tasks is started again."""
        if now - self._watched_at > max(1.0, 4 * self._watch_every):
            self._watched_at = now
            self._watch_generation += 1
            self._spawn(self._watch(self._watch_generation))

    async def _watch(self, generation: int) -> None:
        while generation == self._watch_generation:
            await asyncio.sleep(self._watch_every)
            self._watched_at = now = time.monotonic()
            self.watch_suspects(now)

    def watch_suspects(self, now: float) -> None:
        """Members silent for a third of the timeout are suspect (event ``member_suspect``), shown in the status and
        counted in the metrics until they are heard again (``member_recovered``) or declared dead."""
        suspected, recovered = self.state.membership.suspects(now)
        for m in suspected:
            self._event("member_suspect", node=m.node_id, address=m.address, silent=round(now - m.last_seen, 2))
        for m in recovered:
            self._event("member_recovered", node=m.node_id, address=m.address)

    async def heartbeat(self, msg: p.Heartbeat, conn: Connection) -> int:
        self._watching(time.monotonic())
        if msg.node_id not in self._told and msg.node_id not in self._telling:
            self._spawn(self._tell(msg.node_id))
        if self.state.membership.heartbeat(msg.node_id, time.monotonic()):
            # it was cut off, not gone: partitions restored elsewhere meanwhile stay there
            member = self.state.membership[msg.node_id]
            self._event("member_returned", node=member.node_id, address=member.address)
            await self._save()
            self._spawn(self._welcome_back(member.node_id))
        return self.state.table.epoch

    async def tell_storage(self) -> None:
        """Every serving member not told yet gets the checkpoint storage now (a failure is logged, and its next
        heartbeat tries again; a checkpoint then refuses it, naming it)."""
        members = self.state.membership.members.values()
        await asyncio.gather(*(self._tell(m.node_id) for m in members
                               if m.node_id not in self._told and self.state.membership.serving(m.node_id)))

    async def _tell(self, node_id: str) -> None:
        """One push at a time per member; a second caller waits for the push in flight."""
        task = self._telling.get(node_id)
        if task is None:
            task = self._telling[node_id] = asyncio.ensure_future(self._send_storage(node_id))
            task.add_done_callback(lambda _: self._telling.pop(node_id, None))
        await asyncio.shield(task)

    async def _send_storage(self, node_id: str) -> None:
        checkpoints = checkpoint_config(self.config)
        try:
            await self.peers.channel(node_id).call(p.SetCheckpoints(checkpoints=checkpoints.model_dump() if checkpoints else None))
        except (RockstateError, OSError) as e:  # said once per member, not at every heartbeat that tries again
            (log.debug if node_id in self._untold else log.warning)(
                "%s did not take the checkpoint storage (%s); told again at its next heartbeat", node_id, e)
            self._untold.add(node_id)
            return
        self._told.add(node_id)
        member = self.state.membership.get(node_id)
        url = checkpoints.url or "" if checkpoints else ""
        if member is not None and member.checkpoint_url != url:
            member.checkpoint_url = url
            self._event("member_checkpoints", node=node_id, url=url or None)
            await self._save()

    async def _welcome_back(self, node_id: str) -> None:
        """A node back from being cut off learns the current table (it drops what was restored elsewhere), then gets its share.

        The first call often meets the connection the cut left behind, failing as the kernel gives up on it: asked again.
        """
        try:
            await WELCOME_RETRY.acall(self._send_table, node_id)
        except RockstateError as e:  # its heartbeats' answers name the newer table all the same
            log.warning("%s back from a cut did not take the table: %s", node_id, e)
        await self.replicas.returned(node_id)  # its partitions no one took are its again, told or not
        await self._rebalance()

    async def _send_table(self, node_id: str) -> None:
        async with self.lock:
            await self.peers.channel(node_id).call(p.ApplyTable(table=self.state.table.to_wire()))

    async def leave(self, msg: p.Leave, conn: Connection) -> dict:
        """A node leaving as it stops, or drained by an operator (``msg.drain``: it keeps running and gets nothing)."""
        membership = self.state.membership
        if not membership.leave(msg.node_id, msg.drain):  # nothing moves: drained already, or nobody to take its partitions
            drained = membership[msg.node_id].status is MemberStatus.DRAINED
            self._event("member_stopped", node=msg.node_id,
                        reason="drained: holds nothing" if drained else "last node; partitions stay on its disk")
            await self._save()
            return {"moved": 0}
        moved = []

        async def round_of_moves() -> None:
            try:
                moved.append(await self._rebalance())
                if self._holds_primaries(msg.node_id):
                    raise PartitionUnavailableError(f"{msg.node_id} was given partitions while it left")
            except (RockstateError, OSError) as e:
                log.warning("%s leaving: a round of moves did not finish (%s); planning again", msg.node_id, e)
                raise

        try:
            await LEAVE_RETRY.acall(round_of_moves)
        except (RockstateError, OSError) as e:
            membership.leave_failed(msg.node_id)
            if msg.drain:  # it still runs and serves what did not move; a rebalance spreads partitions back onto it
                self._event("member_drain_failed", node=msg.node_id, reason=str(e))
                await self._save()
                self._spawn(self._rebalance())
            else:  # it exits all the same: what did not move goes to its backups or the checkpoint, as for a death
                await self._declare_dead(msg.node_id, reason=f"its partitions could not all move off it: {e}")
            raise
        await self.replicas.moved_off(msg.node_id)  # never fewer in-sync replicas than configured while it leaves
        membership.left(msg.node_id)
        self._event("member_drained" if msg.drain else "member_left", node=msg.node_id, moved=sum(moved))
        await self._save()
        # its backup copies go with it: left in an in-sync set, primaries would wait for it and a promotion would ask it
        await self.replicas.members_dead([msg.node_id])
        return {"moved": sum(moved)}

    async def undrain(self, msg: p.Undrain, conn: Connection) -> dict:
        self.state.membership.undrain(msg.node_id, time.monotonic())
        self._event("member_undrained", node=msg.node_id)
        await self._save()
        return {"moved": await self._rebalance()}

    async def remove(self, msg: p.RemoveMember, conn: Connection) -> dict:
        """Forget a member that is gone and holds nothing (``Membership.remove`` says when it may not)."""
        state = self.state
        table = state.table  # a dead node's partitions being restored (a failover) are still its own here
        held = [pid for pid in range(table.partitions) if table.owners[pid] == msg.node_id or msg.node_id in table.backups_of(pid)]
        member = state.membership.remove(msg.node_id, time.monotonic(), held)
        self.replicas.zones.pop(msg.node_id, None)  # (the table drops its address with its next change)
        self._event("member_removed", node=member.node_id, address=member.address, was=str(member.status))
        await self._save()
        return {"node": member.node_id, "was": str(member.status)}

    def _holds_primaries(self, node_id: str) -> bool:
        return node_id in self.state.table.owners or (self.replicas.enabled and node_id in self.replicas.owners())
