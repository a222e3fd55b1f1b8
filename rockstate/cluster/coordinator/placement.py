"""The coordinator's side of ``control/placement.py``: the moves that balance the table, and the failover of a dead
node's partitions, carried out; every new table goes out through ``publish``.

A dead node keeps its partitions (they are unavailable until it returns, or,
with checkpoints configured, until they are restored elsewhere): moving them
without their data would lose it. With backups, its partitions first go to
their most advanced in-sync backup (``replication/in_sync.py``); only what has
no replica left is restored. A new cluster's partitions get their first
owners in one table. A join or a graceful leave moves each partition whose
owner changes: plain moves (``migration.py``) at most
``max_concurrent_migrations`` at once; with backups, handovers
(``replication/handover.py``) up to ``HANDOVERS`` at once, whose copies go
in batches (``replication/copy_batches.py``). Every table goes out through
one group commit (``_flush``): the tables of moves, promotions and replica
changes (a report, a backup added or dropped) that arrive while one is being
saved and sent go out together, in one save and one ``ApplyTable`` per node,
so a burst of them costs a few publications, not one each.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Coroutine, Mapping

from ...config import CoordinatorConfig
from ...control import placement
from ...control.membership import MemberStatus
from ...control.migration import Migration
from ...errors import ProtocolError, RockstateError
from ...retry import Retry
from ...rpc.messages import Message
from .. import protocol as p
from .checkpoints import ClusterCheckpoints
from .migration import run_move
from .peers import Peer, Peers
from .state import ClusterState
from ..replication.in_sync import ReplicaControl
from ..table import Table

log = logging.getLogger(__name__)


class _NotYet(Exception):
    """A failover try that did not restore the partitions: no live node yet, or a restore failed."""


@dataclass
class _Sent:
    """Where the coalesced publication stands: publications requested, and the last one saved and sent."""

    requested: int = 0
    saved: int = 0  # the requests the latest saved table holds
    sent: int = 0  # the requests the latest table sent to the nodes holds
    saved_table: Table | None = None
    table: Table | None = None  # the latest table sent, and the epoch each node answered it with
    epochs: dict[str, int] = field(default_factory=dict)
    leaving: bool = False  # a request not sent yet wants a leaving node told
    rebuild: bool = False  # the replica sets changed since the table was decorated: rebuilt before the next send
    sending: asyncio.Lock = field(default_factory=asyncio.Lock)


HANDOVERS = 256  # handovers (moves with backups) at once; their copies still go at most max_concurrent_migrations at once
FAILOVER_RETRY = Retry(deadline=None, initial=0.2, maximum=5.0, retry_on=lambda e: isinstance(e, _NotYet))  # until it is done


def _by_route(moves: list[placement.Move]) -> str:
    routes: dict[tuple[str | None, str], int] = {}
    for m in moves:
        routes[m.source, m.target] = routes.get((m.source, m.target), 0) + 1
    return ", ".join(f"{s} -> {t}: {n}" for (s, t), n in sorted(routes.items(), key=str)) or "none"


class Placement:
    def __init__(self, config: CoordinatorConfig, state: ClusterState, replicas: ReplicaControl, peers: Peers, *,
                 lock: asyncio.Lock, checkpoints: Callable[[], ClusterCheckpoints | None], save: Callable[[], Awaitable[None]],
                 event: Callable[..., None], spawn: Callable[[Coroutine], None]) -> None:
        """``lock``: held while partitions move (checkpoints hold it too); ``checkpoints()``: the cluster's, if any;
        ``save()``: the record kept; ``event(name, **data)``; ``spawn(coro)``: a background task of the leader."""
        self.config, self.state, self.replicas, self.peers, self.lock = config, state, replicas, peers, lock
        self._checkpoints, self._save, self._event, self._spawn = checkpoints, save, event, spawn
        self._sent = _Sent()
        self.load(restore_on_start=False)

    def load(self, restore_on_start: bool) -> None:
        """A record taken up; ``restore_on_start``: a new cluster, so it starts from the storage's latest checkpoint."""
        self._restore_on_start = restore_on_start  # and the storage holds one: see prepare()
        self.resumed = asyncio.Event()  # moves wait until the nodes' leases under an earlier table could have run out

    async def prepare(self) -> None:
        """Before it leads: the checkpoint storage opened, so a request answered from then on finds it."""
        checkpoints = self._checkpoints()
        if checkpoints is not None:
            await checkpoints.open()
            self._restore_on_start = self._restore_on_start and checkpoints.latest() is not None

    def partitions_by_node(self) -> list[tuple[Peer, list[int]]]:
        """Each live owner with the partitions it owns."""
        return [(self.peers.of(o), pids) for o, pids in placement.by_owner(self.state.table.owners, self.state.membership.statuses())]

    # -- the leader's start -------------------------------------------------------------

    async def resume(self) -> None:
        """After a restart: once the nodes have checked in, clear what moves in flight left, and rebalance.

        A move interrupted by the crash never changed the table (it changes
        last), so its source still owns the partition: thawing it and
        dropping the copies rolls the move back; the rebalance redoes it.
        """
        started = time.monotonic()
        while time.monotonic() - started < self.config.heartbeat_timeout and not self.state.membership.checked_in_since(started):
            await asyncio.sleep(0.05)
        async with self.lock:
            await self.broadcast(p.Thaw())
            # a new epoch: a source that let go of a partition just before the crash takes it back
            await self.publish(self.state.table.with_addresses(self.state.membership.addresses()))
        self.resumed.set()
        self._event("coordinator_resumed", epoch=self.state.table.epoch)
        for node_id in self.state.failovers:  # a failover the crash interrupted is done now
            self._spawn(self.failover(node_id))
        await self.rebalance()

    # -- balance ---------------------------------------------------------------------------

    def unbalanced(self) -> bool:
        """Moves are due and nothing is changing the table now."""
        return (self.resumed.is_set() and not self.lock.locked() and not self._forming()
                and bool(placement.rebalance(self.state.table.owners, self.state.membership.statuses())))

    def _forming(self) -> bool:
        """A new cluster: no partition was ever assigned."""
        return all(owner is None for owner in self.state.table.owners)

    async def rebalance(self) -> int:
        """Move partitions until the table is balanced over the live nodes; returns how many moved."""
        await self.resumed.wait()
        async with self.lock:
            if len(self.state.membership.alive()) < (self.config.initial_cluster_size if self._forming() else 1):
                return 0
            planned = placement.rebalance(self.state.table.owners, self.state.membership.statuses())
            first, moves = placement.unassigned(planned)
            started = time.monotonic()
            if planned:  # one line per round (its moves' events are summed per burst: events.py)
                log.info("placement: %d partition(s) assigned, %d to move (%s)", len(first), len(moves), _by_route(moves))
            if first:  # one table for all, whatever P
                owners = list(self.state.table.owners)
                for pid, owner in first.items():
                    owners[pid] = owner
                await self.publish(self.state.table.with_owners(owners, self.state.membership.addresses()), include_leaving=True)
            # with backups, a move's copy joins the others' transfer between the same nodes and its new table theirs
            # (copy_batches.py, publish's group commit): many at once cost little more than one
            limit = asyncio.Semaphore(HANDOVERS if self.replicas.enabled else self.config.max_concurrent_migrations)

            async def one(move: placement.Move) -> None:
                async with limit:
                    await self._move(move)

            # every move ends before the lock is let go: a failed one must not leave the others running beside the
            # next rebalance (it would plan the same partitions again, and two handovers of one would race)
            failed = [r for r in await asyncio.gather(*(one(mv) for mv in moves), return_exceptions=True) if r is not None]
            if failed:
                log.info("placement: %d of %d move(s) failed (the first: %s)", len(failed), len(moves), failed[0])
                raise failed[0]
            if moves:
                log.info("placement: %d partition(s) moved in %.1f s", len(moves), time.monotonic() - started)
            checkpoints = self._checkpoints()  # (restore_on_start: a cluster with checkpoints)
            if self._restore_on_start and checkpoints is not None and None not in self.state.table.owners:
                self._restore_on_start = False
                chk = checkpoints.latest()
                if chk is not None:  # (it is: prepare() found it)
                    await checkpoints.restore_partitions(chk, self.partitions_by_node())
                    self._event("cluster_restored", checkpoint=chk, reason="new cluster on a storage with checkpoints")
            self._spawn(self.replicas.ensure())
            return len(planned)

    async def _move(self, move: placement.Move) -> None:
        """Move a partition (migration.py; with backups, handover.py); writes to it wait only from the freeze to the new table."""
        serving = self.state.membership.serving
        if self.replicas.enabled and move.source is not None:  # (None: a new cluster's first placement)
            await self.replicas.hand_over(move, serving(move.source))
            return
        m = Migration(move.partition, move.source, move.target, source_serving=serving(move.source),
                      live=self.config.live_migration)
        source = self.peers.of(move.source) if m.copies and move.source is not None else None  # (copies: it serves)
        await self.replicas.before_move(move.partition, move.target)
        await run_move(m, source.rpc(self.peers.security) if source else None, self.peers.channel(move.target),
                       source.address if source else None, lambda: self._commit_owner(m.partition, m.target), self._event)

    async def _commit_owner(self, pid: int, owner: str) -> None:
        """The new owner serves from the next epoch."""
        owners = list(self.state.table.owners)
        owners[pid] = owner
        await self.publish(self.state.table.with_owners(owners, self.state.membership.addresses()), include_leaving=True)

    # -- a dead node -------------------------------------------------------------------------

    async def declare_dead(self, node_id: str, **why: str) -> None:
        self._event("member_dead", node=node_id, address=self.state.membership[node_id].address, **why)
        if self._checkpoints() is not None:
            self.state.failovers.add(node_id)
        await self._save()
        self._spawn(self._dead(node_id))

    async def _dead(self, node_id: str) -> None:
        """A dead node: its backups promoted where it was primary; then what has no replica left is restored."""
        await self.replicas.members_dead([node_id])
        if self._checkpoints() is not None:
            await self.failover(node_id)
        if self.replicas.enabled:
            self._spawn(self.replicas.ensure())  # backup_count restored first (not after the moves): durability before balance
            await self.rebalance()  # the promoted primaries spread out again

    async def restore_lost(self, dead: str) -> None:
        """A dead node's partitions whose election found no candidate: restored from the checkpoint, as without backups."""
        if self._checkpoints() is not None and self.state.membership.statuses().get(dead) is MemberStatus.DEAD:
            self.state.failovers.add(dead)
            await self._save()
            self._spawn(self.failover(dead))

    async def failover(self, dead: str) -> None:
        """Give a dead node's partitions to the live nodes, restored from the latest completed checkpoint.

        What was written to them after that checkpoint is lost; the
        ``partition_restored`` events name the checkpoint so a pipeline can
        rewind to it and replay. A failed restore (storage or a target node
        failing) is retried until it works or the node comes back: until
        then its partitions are unavailable, never served from an older state.
        """
        async def once() -> None:
            try:
                async with self.lock:
                    electing = self.replicas.pending()  # their backups are asked first: not restored
                    owners = [None if pid in electing else o for pid, o in enumerate(self.state.table.owners)]
                    plan = placement.failover(owners, self.state.membership.statuses(), dead)
                    if plan is not None and dead in self.state.failovers and plan.new_owner:
                        await self._restore_elsewhere(dead, plan)
            except (RockstateError, OSError) as exc:
                log.warning("failover of %s's partitions failed (%s); retrying", dead, exc)
                self._event("failover_retry", node=dead, reason=str(exc))
                raise _NotYet() from exc
            if plan is None:  # no live node is not an error: it waits quietly
                raise _NotYet()

        await FAILOVER_RETRY.acall(once)
        if dead in self.state.failovers:
            self.state.failovers.discard(dead)
            await self._save()

    async def _restore_elsewhere(self, dead: str, plan: placement.FailoverPlan) -> None:
        checkpoints = self._checkpoints()  # (a failover is recorded only with checkpoints)
        chk = checkpoints.latest() if checkpoints is not None else None
        if checkpoints is not None and chk is not None:
            await checkpoints.restore_partitions(chk, [(self.peers.of(t), pids) for t, pids in plan.by_target().items()])
        for pid, node in plan.new_owner.items():  # recorded before the table: a crash in between repeats the failover
            self._event("partition_restored", partition=pid, checkpoint=chk, node=node, previous=dead)
        table = self.state.table
        await self.publish(table.with_owners(plan.owners(table.owners), self.state.membership.addresses()))

    # -- a new table ---------------------------------------------------------------------------

    async def publish(self, table: Table, include_leaving: bool = False) -> None:
        """A new table: kept, then sent to the nodes (a leaving one too, while its partitions move off it).

        A table with new owners (a move, a promotion, a restore) is the coordinator's at once: the record holds it
        from now on, so a table built meanwhile cannot undo it. It goes out through the same group commit as replica
        changes (``_flush``): the tables of moves that end while one is being saved and sent go out together, in
        one save and one ``ApplyTable`` per node; this returns once a table that holds it reached the nodes."""
        sent = self._sent
        sent.requested += 1
        mine = sent.requested
        self.state.table, catch_ups = self.replicas.decorate(table)
        sent.rebuild = False  # decorated with the replica sets as they are: every request so far is in it
        await self._flush(mine, include_leaving)
        await self.replicas.carry_out(catch_ups)

    async def publish_owners(self, owners: Mapping[int, str | None]) -> None:
        """The table with these primaries (partition -> primary: the replica control's promotions and handovers), a
        leaving node told too.

        The table is rebuilt from the replica sets once for every change that arrived while the previous table was
        being sent (``_flush``): O(P) per batch, not per report or promotion."""
        table = self.state.table
        changed = [pid for pid, owner in owners.items() if owner != table.owners[pid]]
        if changed:
            # new primaries are the coordinator's at once (a table built meanwhile must not undo them), with their
            # partitions' replica sets; the rest is rebuilt once per group commit below. Decorating the whole table
            # per promotion was half the coordinator's CPU in a P=1024 join (256 handovers).
            primaries = list(table.owners)
            for pid in changed:
                primaries[pid] = owners[pid]
            self.state.table = self.replicas.patched(table.with_owners(primaries, self.state.membership.addresses()), changed)
        sent = self._sent
        sent.requested += 1
        sent.rebuild = True
        await self._flush(sent.requested, include_leaving=True)

    async def _flush(self, mine: int, include_leaving: bool) -> None:
        """Return once request ``mine`` (a replica change to rebuild the table with) is in a table that is saved
        and then sent to the nodes.

        One send at a time; what waits for it goes out together (a group commit): the table the latest save kept,
        never a newer one, so no node hears of an epoch before the coordinator saved it. A replica change not yet
        in a saved table has the table rebuilt and saved here first, once for all of those waiting (until then
        the coordinator's table does not show it: nothing unsaved is handed out). The nodes drop a table older
        than theirs."""
        sent = self._sent
        sent.leaving |= include_leaving
        async with sent.sending:
            if sent.sent >= mine:
                return  # a send that began after this request was saved covered it
            if sent.saved < mine:
                if sent.rebuild:
                    sent.rebuild = False
                    self._rebuild()
                upto, table = sent.requested, self.state.table
                await self._save()  # the record as of now: ``table`` with it
                if upto > sent.saved:
                    sent.saved, sent.saved_table = upto, table
            upto, saved, leaving = sent.saved, sent.saved_table, sent.leaving
            sent.leaving = False
            try:
                if saved is not None:
                    await self._send_table(saved, leaving)
            except BaseException:
                sent.leaving |= leaving
                raise
            sent.sent = max(sent.sent, upto)

    async def _send_table(self, table: Table, include_leaving: bool) -> None:
        """``table`` to the nodes: as a delta to each that answered the last one sent (its rows that changed: a few
        of P, where the whole table costs every node a decoding and a comparison of P rows, and the coordinator an
        encoding per node), whole to the others and to any that did not take the delta (a node of an earlier
        version, or one that got a table some other way)."""
        sent = self._sent
        base, known = sent.table, sent.epochs
        delta = table.delta_from(base) if base is not None else None
        members = self._members(include_leaving)
        told = [m for m in members if delta is not None and known.get(m.node_id) == base.epoch]  # type: ignore[union-attr]
        answers = await self.peers.broadcast(told, p.ApplyTable(delta=delta)) if told else []
        refused = {peer.node_id for peer, epoch in answers  # another base (an int), or no delta field (an error)
                   if (type(epoch) is int and epoch < table.epoch) or isinstance(epoch, ProtocolError)}
        rest = [m for m in members if m not in told or m.node_id in refused]
        if rest:
            answers = [a for a in answers if a[0].node_id not in refused]
            answers += await self.peers.broadcast(rest, p.ApplyTable(table=table.to_wire()))
        sent.table, sent.epochs = table, {peer.node_id: epoch for peer, epoch in answers if type(epoch) is int}
        self.state.table_sent(table.epoch)

    def _members(self, include_leaving: bool) -> list:
        wanted = (MemberStatus.ALIVE, MemberStatus.LEAVING) if include_leaving else (MemberStatus.ALIVE,)
        return [m for m in self.state.membership.members.values() if m.status in wanted]

    def _rebuild(self) -> None:
        """The table with the replica sets as they are now (a new epoch), its primaries theirs."""
        table = self.state.table.with_owners(self.replicas.owners(), self.state.membership.addresses())
        self.state.table, catch_ups = self.replicas.decorate(table)
        if catch_ups:  # none: the primaries are the sets' own (the caller checked they did not change)
            self._spawn(self.replicas.carry_out(list(catch_ups)))

    async def broadcast(self, msg: Message, include_leaving: bool = False) -> list[tuple[Peer, Any]]:
        return await self.peers.broadcast(self._members(include_leaving), msg)
