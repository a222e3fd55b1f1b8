"""The coordinator's side of replicated partitions: it carries out what ``control/in_sync.py`` and
``control/replica_placement.py`` decide, and puts the replica sets into the table it publishes.

- Every table the coordinator publishes goes through ``decorate``: a primary
  that changed by a copy (a partition's first owner, a move, a restore from a
  checkpoint) is given to ``InSyncSets``, and the table carries each
  partition's backups, in-sync backups and replica epoch.
- ``ensure`` (after a rebalance, and every few seconds): the backups the
  replica plan wants and the partition lacks are added (``CatchUp``: the new
  backup copies the partition from its primary), those it no longer wants
  dropped; a backup out of sync for longer than a few replica timeouts
  without a catch-up under way catches up anew (it restarted, or fell too far
  behind for the primary's log); one out of sync when this coordinator starts
  leading (a restart, a takeover), at its first round. A dead primary that
  is alive again before its partitions got a new one takes them back here
  too, if its welcome (``returned``) did not reach it.
- ``report``: a primary's ``caught_up``, ``unreachable`` and ``diverged``
  (its copy was restored or got an SST file: the backup copies it anew at
  once); each changes the in-sync set with an epoch bump, published before
  the primary acknowledges anything without the backup.
- ``members_dead``: a dead node leaves every replica set; a partition whose
  primary died gets its most advanced in-sync backup as primary (event
  ``primary_promoted``), asked until one that holds a copy answers; with none
  left, or none answering within ``ELECTION_TIMEOUT``, the event
  ``promotion_failed`` names why and the partition goes to the checkpoint
  restore (``pending`` tells the failover which partitions are still being
  promoted: they are not restored). Each node is asked once for all its
  partitions, and a round's promotions go out in one table.
- Catch-ups go through ``copy_batches.py``: those of one backup from one
  primary travel in one transfer.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from dataclasses import replace
from typing import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence

from ...config import CoordinatorConfig
from ...control import placement, replica_placement
from ...control.in_sync import AskPositions, CatchUp, InSyncSets, Promoted, Publish, ReplicaSet, RestoreFromCheckpoint
from ...control.membership import MemberStatus
from ...control.migration import Handover
from ...errors import RockstateError
from ...rpc.async_client import AsyncChannel
from ...rpc.server import Connection
from .. import protocol as p
from .copy_batches import CopyBatches
from .handover import run_handover
from .outcomes import Report
from ..table import Table

log = logging.getLogger(__name__)

CATCH_UP_TIMEOUT = 600.0
LEAVE_TIMEOUT = 300.0  # seconds a leaving node's backups may take to be replaced
PLAN_AGE = 2.0  # seconds a replica plan serves handovers for
SOON = 0.05  # seconds ensure_soon waits for more reports before a round
STUCK = 10  # replica timeouts a backup may stay out of sync before it copies anew (a copy under load takes seconds to stream level)


class ReplicaControl:
    def __init__(self, config: CoordinatorConfig, *, publish: Callable[[Mapping[int, str | None]], Awaitable[None]],
                 statuses: Callable[[], Mapping[str, MemberStatus]], channel: Callable[[str], AsyncChannel],
                 address: Callable[[str], str], restore_lost: Callable[[str], Awaitable[None]],
                 spawn: Callable[[Coroutine], None], event: Callable[..., None]) -> None:
        """``publish(owners)``: a new table with these primaries (partition -> primary, of those that may have
        changed), sent to the members (a leaving one too);
        ``statuses()``: every member's status; ``channel(node)``/``address(node)``: a member's connection and address
        (KeyError: not a member); ``restore_lost(node)``: a dead node's partitions that no backup took go to the
        checkpoint restore; ``spawn(coro)``: a background task of the leading coordinator; ``event(name, **data)``."""
        self.backup_count, self.replication, self.timeout = config.backup_count, config.replication, config.replica_timeout
        self._publish, self._statuses, self._channel, self._address = publish, statuses, channel, address
        self._restore_lost, self._spawn, self._event = restore_lost, spawn, event
        self._copies = CopyBatches(self._send_catch_up, config.max_concurrent_migrations)
        self._plan: tuple[float, replica_placement.ReplicaPlan, Counter[str]] | None = None  # see _round
        self._ensuring = self._again = False  # ensure_soon's round running, and another wanted after it
        self._planned_steps = False  # the last replica plan had steps (each begun once the one before is in sync)
        self._moving: dict[int, tuple[str, str]] = {}  # pid -> (source, target) of its handover under way
        self._intended: dict[int, list[str]] = {}  # pid -> the replicas a plan's adds under way lead to
        self.load({}, [])

    def load(self, saved: dict, owners: Sequence[str | None]) -> None:
        """Take up a saved record's replica sets and zones (none saved: each owner is its partition's primary)."""
        if saved.get("replicas"):
            self.sets = InSyncSets.from_wire(self.backup_count, saved["replicas"])
        else:
            self.sets = InSyncSets(self.backup_count, [[o] if o else [] for o in owners])
        self.zones: dict[str, str] = saved.get("zones", {})
        self._intended = {}  # a leader's own: the steps a previous leadership began are not known here
        # since when, as this coordinator saw it. A backup out of sync when it starts leading is due at once: a copy
        # the last leader started is not known here (one still under way on the node is joined there, not repeated)
        self._out_of_sync: dict[tuple[int, str], float] = {
            (pid, b): -math.inf for pid, s in enumerate(self.sets.sets) for b in s.backups if b not in s.in_sync}

    @property
    def enabled(self) -> bool:
        return self.backup_count > 0

    def to_wire(self) -> dict:
        return {"replicas": self.sets.to_wire(), "zones": self.zones} if self.enabled else {}

    # -- the table -------------------------------------------------------------------

    def decorate(self, table: Table) -> tuple[Table, list[CatchUp]]:
        """``table`` with the replica sets; its owners that changed by a copy are the new primaries."""
        if not self.enabled:  # a cluster that had backups before a restart without them: none any more
            return replace(table, backups=(), in_sync=(), replica_epochs=(), backup_count=0), []
        actions = []
        lost = self.sets.lost()
        for pid, owner in enumerate(table.owners):
            s = self.sets[pid]
            if owner is None or owner == s.primary or lost.get(pid) == owner:
                continue
            actions += self.sets.restored(pid, owner) if pid in lost else self.sets.moved(pid, owner)
        sets = self.sets.sets
        table = replace(table, backups=tuple(tuple(s.backups) for s in sets),
                        in_sync=tuple(map(_in_sync, sets)),
                        replica_epochs=tuple(s.epoch for s in sets), backup_count=self.backup_count,
                        replication=self.replication, replica_timeout=self.timeout)
        return table, [a for a in actions if isinstance(a, CatchUp)]

    def patched(self, table: Table, pids: Sequence[int]) -> Table:
        """``table`` with the replica sets of ``pids`` as they are now (``decorate``'s, for a few partitions)."""
        if not self.enabled or not pids:
            return table
        if len(table.backups) != len(table.owners):  # never decorated yet
            return self.decorate(table)[0]
        backups, in_sync, epochs = list(table.backups), list(table.in_sync), list(table.replica_epochs)
        for pid in pids:
            s = self.sets[pid]
            backups[pid], in_sync[pid], epochs[pid] = tuple(s.backups), _in_sync(s), s.epoch
        return replace(table, backups=tuple(backups), in_sync=tuple(in_sync), replica_epochs=tuple(epochs))

    def owners(self) -> list[str | None]:
        """Primaries; a partition waiting for a promotion or a restore keeps its dead one."""
        lost = self.sets.lost()
        if not lost:
            return [s.primary for s in self.sets.sets]
        return [lost.get(pid, s.primary) for pid, s in enumerate(self.sets.sets)]

    async def publish(self, pids: Iterable[int]) -> None:
        """A table with the replica sets as they are now, ``pids`` those that changed: O(1) in P (256 handovers begun
        at once, each listing every partition's primary twice, held the coordinator's loop ~50 ms at P=1024)."""
        lost = self.sets.lost()
        await self._publish({pid: lost.get(pid, self.sets[pid].primary) for pid in pids})

    def pending(self) -> set[int]:
        """Partitions whose primary died and whose backups are still being asked: not for a restore."""
        return {pid for pid in self.sets.lost() if self.sets[pid].backups}

    # -- carrying out actions ----------------------------------------------------------

    async def carry_out(self, actions: list) -> None:
        published = [a.partition for a in actions if isinstance(a, Publish)]
        if published:
            await self.publish(published)
        for a in actions:
            if isinstance(a, CatchUp):
                self._spawn_catch_up(a)
        await self._elect([a for a in actions if isinstance(a, AskPositions)])

    def _spawn_catch_up(self, a: CatchUp) -> None:
        if a.node in self._statuses() and self.sets.copy_started(a.partition, a.node):
            self._spawn(self._catch_up(a))

    async def catch_up(self, a: CatchUp) -> int | None:
        """Carry out a catch-up and wait for its copy; answers the bytes copied (None: none, or it failed)."""
        if a.node in self._statuses() and self.sets.copy_started(a.partition, a.node):
            return await self._catch_up(a)
        return None

    async def _catch_up(self, a: CatchUp) -> int | None:
        try:
            s = self.sets[a.partition]
            if a.node not in s.backups or s.primary is None:
                return None
            started, primary = time.monotonic(), s.primary
            copied = await self._copies.copy(a.node, primary, a.partition, s.epoch)
            if copied is not None:
                self._event("replica_copied", partition=a.partition, node=a.node, primary=primary, bytes=copied,
                            seconds=round(time.monotonic() - started, 3))
            return copied
        finally:
            self.sets.copy_finished(a.partition, a.node)
            self._out_of_sync[a.partition, a.node] = time.monotonic()  # the next try, if needed, after STUCK timeouts

    async def _send_catch_up(self, node: str, primary: str, epochs: dict[int, int]) -> dict:
        """One ``ReplicaCatchUp``: ``node`` copies these partitions from ``primary`` in one transfer."""
        return await self._channel(node).call(p.ReplicaCatchUp(
            partitions=[[pid, epoch] for pid, epoch in sorted(epochs.items())], source=self._address(primary)),
            timeout=CATCH_UP_TIMEOUT)

    async def _elect(self, asks: list[AskPositions]) -> None:
        """Ask the in-sync backups of partitions whose primary died how far they are, one request per node, and
        promote each partition's most advanced: every promotion of the round in one table."""
        if not asks:
            return
        by_node: dict[str, list[int]] = {}
        for a in asks:
            for node in a.nodes:
                by_node.setdefault(node, []).append(a.partition)

        async def ask(node: str, pids: list[int]) -> tuple[str, dict | None]:
            try:
                answer = await self._channel(node).call(p.ReplicaPositions(partitions=pids), timeout=max(2.0, 2 * self.timeout))
                return node, {pid: answer.get(pid, answer.get(str(pid))) for pid in pids}  # None: it holds no copy
            except (RockstateError, OSError, KeyError, AttributeError):
                return node, None  # no answer

        answers = dict(await asyncio.gather(*(ask(node, pids) for node, pids in by_node.items())))
        now, decided = time.monotonic(), []
        for a in asks:
            got = {n: answers[n][a.partition] for n in a.nodes if answers.get(n) is not None}  # type: ignore[index]
            decided += [(act, got) for act in self.sets.positions(a.partition, got, now)]
        if decided:
            await self.publish({act.partition for act, _ in decided})
        lost = []
        for act, got in decided:
            if isinstance(act, Promoted):
                self._event("primary_promoted", partition=act.partition, node=act.primary, previous=act.previous,
                            epoch=act.epoch, position=got[act.primary])
            elif isinstance(act, RestoreFromCheckpoint):
                self._event("promotion_failed", partition=act.partition, previous=act.lost, reason=act.reason)
                lost += [act.lost] if act.lost not in lost else []
        for node in lost:
            await self._restore_lost(node)

    # -- events ------------------------------------------------------------------

    async def before_move(self, pid: int, target: str) -> None:
        """A partition is about to be copied to ``target`` as its next primary: it stops being a backup there first."""
        if self.enabled:
            await self.carry_out(self.sets.leave(pid, target))

    async def hand_over(self, move: placement.Move, source_serving: bool) -> None:
        """Move a partition's primary by a handover (handover.py), adding first the replicas the old primary's
        departure needs. A move planned before its source died or the partition changed hands is dropped: as a plain
        move it would give the target no data, and the backups would copy that (chaos seed 8 --ha lost partitions
        so); the next rebalance plans anew."""
        pid, s = move.partition, self.sets[move.partition]
        if not source_serving or move.source is None or move.source != s.primary:
            log.info("move of partition %d from %s to %s dropped: its primary is %s now", pid, move.source, move.target, s.primary)
            return
        adds = replica_placement.handover_adds(self.sets.view(), pid, move.source, move.target, s.in_sync,
                                               self._statuses(), self.backup_count, self.zones,
                                               lambda: self._round()[1].target[pid], lambda: self._round()[2])
        if self._plan is not None:
            self._plan[2].update(adds)  # the next handover of the round counts them
        self._moving[pid] = (move.source, move.target)
        try:
            await run_handover(Handover(pid, move.source, move.target, tuple(adds)), self.sets, carry_out=self.carry_out,
                               catch_up=self.catch_up, channel=self._channel, event=self._event)
        finally:
            self._moving.pop(pid, None)

    def _round(self) -> tuple[float, replica_placement.ReplicaPlan, Counter[str]]:
        """(when, a plan, the replicas each node held then): one, at most ``PLAN_AGE`` seconds old, serves every
        handover of a round. Each is O(P): a plan per handover held the loop for seconds at P=1024, the count ~0.3 s
        for 256 handovers."""
        now = time.monotonic()
        if self._plan is None or now - self._plan[0] > PLAN_AGE:
            table = self.sets.table()
            self._plan = now, replica_placement.plan(table, self._statuses(), self.backup_count, self.zones), \
                Counter(n for r in table for n in r)
        return self._plan

    async def moved_off(self, node: str, timeout: float = LEAVE_TIMEOUT) -> None:
        """A leaving node's backups are replaced (``ensure``: each new one in sync before the old one is dropped);
        returns once it holds none, or after ``timeout`` (its copies then go with it, as a dead node's)."""
        deadline = time.monotonic() + timeout
        while self.enabled and any(node in s.backups for s in self.sets.sets):
            if time.monotonic() > deadline:
                log.warning("%s still holds backups after %gs of its leave; they go with it", node, timeout)
                return
            await self.ensure()
            await asyncio.sleep(0.25)

    async def members_dead(self, nodes: list[str]) -> None:
        if self.enabled:
            await self.carry_out(self.sets.members_dead(nodes))

    async def elect_pending(self) -> None:
        """Partitions still without a primary whose backups did not answer yet: ask again."""
        await self._elect([AskPositions(pid, tuple(sorted(self.sets[pid].backups))) for pid in sorted(self.pending())])

    async def returned(self, node: str) -> None:
        if self.enabled:
            await self.carry_out(self.sets.returned(node))

    async def report(self, msg: p.ReplicaReport, conn: Connection) -> None:
        actions = []
        in_sync = False  # a backup came in sync: the plan's next steps (a drop, a move of a backup) may go now
        for pid, backup, epoch, kind in msg.reports:
            s = self.sets[pid]
            if s.primary != msg.node_id:
                continue  # a deposed primary's report
            if kind == Report.CAUGHT_UP:
                was_in_sync = backup in s.in_sync  # (a primary says so again until its table has it in sync)
                done = self.sets.caught_up(pid, backup, epoch)
                in_sync |= not was_in_sync and backup in self.sets[pid].in_sync
                log.debug("%s: %s caught up at epoch %d (now %d, copying %s): %s", msg.node_id, backup, epoch, s.epoch,
                          (pid, backup) in self.sets.copying, "in sync" if backup in s.in_sync else "refused")
                actions += done
            elif kind in (Report.UNREACHABLE, Report.DIVERGED):
                was_in_sync = backup in s.in_sync
                done = (self.sets.unreachable(pid, backup, epoch) if kind == Report.UNREACHABLE
                        else self.sets.diverged(pid, backup, epoch))
                if was_in_sync and done:
                    self._out_of_sync[pid, backup] = time.monotonic()  # the stream may bring it back; else a copy
                    self._event("replica_out_of_sync", partition=pid, node=backup, primary=msg.node_id, reason=kind)
                # diverged (no copy open, or the primary's copy was restored or got an SST file): only a copy brings it back
                actions += [a for a in done if kind == Report.DIVERGED or not isinstance(a, CatchUp)]
        await self.carry_out(actions)
        if in_sync and self._planned_steps:
            self.ensure_soon()  # the last plan had steps to take (a join, a leave): the next may go now

    def ensure_soon(self) -> None:
        """``ensure`` now rather than at the monitor's next round (a join's backups move in steps, each begun once
        the one before is in sync: a second each was most of a join at P=1024); one at a time, a call meanwhile
        runs it once more after."""
        if self._ensuring:
            self._again = True
            return
        self._ensuring = True

        async def rounds() -> None:
            try:
                while True:
                    await asyncio.sleep(SOON)  # the reports of one burst go together
                    self._again = False
                    await self.ensure()
                    if not self._again:
                        return
            finally:
                self._ensuring = False
        self._spawn(rounds())

    async def ensure(self) -> None:
        """Add the backups the plan wants, drop those it does not, restart catch-ups that are stuck."""
        if not self.enabled or MemberStatus.ALIVE not in self._statuses().values():
            return
        try:
            await self._ensure()
        except (RockstateError, OSError) as e:
            log.warning("replica placement failed (retried): %s", e)
        except Exception:  # noqa: BLE001 -- a bug here must not stop the next round; say it loudly
            log.exception("replica placement failed")

    async def _ensure(self) -> None:
        await self.elect_pending()
        statuses = self._statuses()
        # a dead primary back before its partitions got a new one takes them again, even if its welcome failed
        for node in sorted({n for n in self.sets.lost().values() if statuses.get(n) is MemberStatus.ALIVE}):
            await self.carry_out(self.sets.returned(node))
        view, due, self._intended = replica_placement.under_way(self.sets.table(), self._moving, self._intended)
        plan = replica_placement.plan(view, statuses, self.backup_count, self.zones)
        steps = plan.steps + [replica_placement.ReplicaStep(pid, replica_placement.StepKind.DROP, n)
                              for pid, nodes in due.items() for n in nodes]
        self._planned_steps = bool(steps)
        lost, actions = self.sets.lost(), []
        for step in steps:
            s = self.sets[step.partition]
            if step.partition in lost or step.partition in self._moving or plan.target[step.partition][0] != s.primary:
                continue  # the primary moves or is elected first
            if step.kind is replica_placement.StepKind.ADD:
                actions += self.sets.add_backup(step.partition, step.node)
                self._intended[step.partition] = plan.target[step.partition]
            elif step.kind is replica_placement.StepKind.DROP:
                actions += self.sets.drop(step.partition, step.node) or []
        now = time.monotonic()
        stuck: dict[str, list[int]] = {}
        for pid, s in enumerate(self.sets.sets):
            if s.primary is None:
                continue  # electing or lost: there is no copy to take until a primary serves
            for b in s.backups:
                if b in s.in_sync or (pid, b) in self.sets.copying or statuses.get(b) is not MemberStatus.ALIVE:
                    continue
                if now - self._out_of_sync.setdefault((pid, b), now) > STUCK * self.timeout:
                    stuck.setdefault(b, []).append(pid)
                    actions.append(CatchUp(pid, b, s.primary))
        for b, pids in stuck.items():  # one line per backup node, not per partition
            log.info("backup %s out of sync for over %.1fs since its last copy or report on %d partition(s) %s: copies anew",
                     b, STUCK * self.timeout, len(pids), pids[:16] + (["..."] if len(pids) > 16 else []))
        await self.carry_out(actions)

    # -- status ------------------------------------------------------------------

    def status(self) -> list[dict]:
        lost = self.sets.lost()
        return [{"partition": pid, "primary": s.primary, "epoch": s.epoch, "waiting_for_election": pid in lost,
                 "backups": [{"node": b, "in_sync": b in s.in_sync} for b in s.backups]}
                for pid, s in enumerate(self.sets.sets)]


def _in_sync(s: ReplicaSet) -> tuple[str, ...]:
    """A set's in-sync backups as the table names them (the primary is not one)."""
    return tuple(sorted(s.in_sync.difference((s.primary,))))
