"""Each partition's replicas and in-sync set, as the coordinator decides them (Kafka's ISR, PacificA's configuration).

A partition has a primary, backups, an in-sync set (the primary and the
backups that hold every acknowledged write) and an epoch. Every change of
the set bumps the epoch and answers ``Publish``: the caller saves it and
sends it to the partition's replicas. A primary acknowledges a write once
every in-sync member applied it (``write_acks.PrimaryAcks``); backups refuse
batches of an older epoch, so a deposed primary cannot write through them.

States of one backup::

    add_backup() ──▶ CATCHING_UP ── caught_up() ──▶ IN_SYNC ── unreachable() ──▶ CATCHING_UP
                         │  ▲                         │
            copy_started()│  │copy_finished()          │
                         ▼  │                         │
                       COPYING (caught_up() refused)  │
                         │                            │
                         └────── drop() / members_dead() ─────▶ gone

States of a partition whose primary died::

    members_dead() ──▶ ELECTING ── positions(): an in-sync backup answered ──▶ promoted (a primary again)
                         │   └──── returned(): the dead primary is back ─────▶ its primary again
                         └── no candidate left, or none answered within election_timeout
                               ──▶ RESTORING (RestoreFromCheckpoint) ── restored() ──▶ a primary again

Transitions (stale reports, for an older epoch or a member no longer in
that state, change nothing and answer no action):

- ``add_backup(pid, node)``: a new replica (a planned ADD: a new or
  returning member) is CATCHING_UP; ``CatchUp`` tells the primary to send
  it a snapshot copy and then the write delta.
- ``copy_started(pid, node)`` / ``copy_finished(pid, node)``: the caller
  carries out a ``CatchUp`` (the backup drops what it held and copies the
  partition anew) between the two; False from the first when one is under
  way already or the backup needs none.
- ``caught_up(pid, node, epoch)``: the primary reports the backup has
  applied everything it sent; the primary already waits for it on every
  write (``PrimaryAcks.caught_up``), so the in-sync set only ever names
  members the primary waits for. IN_SYNC. Refused while the backup copies
  anew (a late report of its previous copy, which it is dropping: counted in
  sync it would hold no copy), with an epoch bump all the same: the primary
  waits for a backup it reported until a newer epoch answers the report.
- ``unreachable(pid, node, epoch)``: the primary reports a backup behind or
  cut off. It leaves the in-sync set (CATCHING_UP again, the primary resends
  from its position) with an epoch bump; only when that epoch reaches the
  primary may it acknowledge writes without it.
- ``diverged(pid, node, epoch)``: the primary reports a backup with no copy
  its stream can extend (a restarted node holds none open; the primary's copy
  was restored). As ``unreachable``, and a ``CatchUp`` even when it was out
  of the set already: waiting for the stream would leave the partition one
  replica short until a stuck copy is retried.
- ``promote(pid, node, source)``: a planned PROMOTE (``migration.Handover``),
  of a backup of ``source``'s partition; the caller has frozen the old
  primary's writes, seen them acknowledged and the backup's position reach
  them, so it holds every write even if a report took it out of the set
  meanwhile. The old primary leaves the set (its node retires its copy); a
  plan that keeps it as a backup adds it back. Refused ([]) once the
  partition has another primary or the node is no backup of it.
- ``drop(pid, node)``: a planned DROP. Refused (None) while it would take
  the in-sync set below ``backup_count + 1`` and an added replica is still
  catching up (the caller waits for ``caught_up`` first), while the
  partition elects a primary, or while a running handover holds the node.
- ``reserve(pid, nodes)`` / ``release(pid)``: a handover's target and added replicas,
  from its ADD to its end: the planner, which sees only replica counts,
  would otherwise drop the one still catching up as an extra backup and
  fail the handover.
- ``members_dead(nodes)``: the coordinator declared them dead. They leave
  every partition. A partition whose primary died has no primary; its
  in-sync backups are asked for their positions (``AskPositions``);
  with none left, ``RestoreFromCheckpoint`` (today's path, and its loss
  since that checkpoint). Out-of-sync backups of such a partition are
  dropped: they lack acknowledged writes.
- ``positions(pid, {node: applied sequence or None}, now)``: the answers
  (None: it answered but holds no copy, so it is no candidate and leaves the
  set). The most advanced in-sync backup that holds a copy becomes primary
  (``Promoted``, the event ``primary_promoted``). Every acknowledged write
  is on every in-sync backup, and each one's batches are a prefix of the new
  primary's, so the others stay in sync once they apply its tail. Members
  that did not answer are dropped (they catch up anew later). No answer:
  nothing yet, until ``election_timeout`` after the first ask; with no
  candidate left, or none answering by then, ``RestoreFromCheckpoint`` (its
  ``reason`` says which). An election never waits forever.
- ``restored(pid, node)``: the partition was restored from the checkpoint
  on ``node``, its only replica; the planner adds backups.
- ``moved(pid, node)``: the primary changed by a copy (the first owner, a
  move): the backups hold another history than the new primary's copy, so
  they are out of sync and catch up anew (``CatchUp`` each).
- ``leave(pid, node)``: the backup is about to receive the partition as
  its primary by a copy (a move): it stops being a backup at once.
- ``returned(node)``: a node declared dead is back before its partitions
  got a new primary (an election or a restore): they are its again (its
  copy holds everything acknowledged), and their backups catch up anew.

``to_wire``/``from_wire``: the sets as the coordinator saves them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence, cast, overload


@dataclass
class ReplicaSet:
    primary: str | None
    backups: list[str] = field(default_factory=list)
    in_sync: set[str] = field(default_factory=set)  # the primary too
    epoch: int = 1

    def replicas(self) -> list[str]:
        return ([self.primary] if self.primary else []) + self.backups


@dataclass(frozen=True)
class Publish:
    partition: int
    epoch: int
    primary: str | None
    backups: tuple[str, ...]
    in_sync: tuple[str, ...]


@dataclass(frozen=True)
class CatchUp:
    partition: int
    node: str
    source: str  # the primary


@dataclass(frozen=True)
class AskPositions:
    partition: int
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class Promoted:
    partition: int
    previous: str
    primary: str
    epoch: int


@dataclass(frozen=True)
class RestoreFromCheckpoint:
    partition: int
    lost: str  # the dead primary
    reason: str = "no in-sync backup left"


Action = Publish | CatchUp | AskPositions | Promoted | RestoreFromCheckpoint


ELECTION_TIMEOUT = 20.0  # seconds an election waits for an answer from a live candidate before the restore


class InSyncSets:
    def __init__(self, backup_count: int, replicas: Sequence[Sequence[str]], election_timeout: float = ELECTION_TIMEOUT) -> None:
        """Every replica of ``replicas`` (partition -> [primary, backups...]) starts in sync."""
        self.backup_count, self.election_timeout = backup_count, election_timeout
        self.sets = [ReplicaSet(r[0] if r else None, list(r[1:]), set(r)) for r in replicas]
        # partition without a primary -> its dead one; its backups, all in sync, are the candidates (none: a restore)
        self._lost: dict[int, str] = {}
        self._asked_since: dict[int, float] = {}  # partition -> when its election first asked (not saved: asked anew)
        self.copying: set[tuple[int, str]] = set()  # (partition, backup) copying anew (not saved: a restart copies anew)
        self.reserved: dict[int, set[str]] = {}  # partition -> its running handover's target and added replicas (not saved)

    def __getitem__(self, pid: int) -> ReplicaSet:
        return self.sets[pid]

    def table(self) -> list[list[str]]:
        """Partition -> [primary, backups...], the planner's input. One without a primary names its dead one,
        so the planner leaves it to the election or the restore."""
        return [self.replicas(pid) for pid in range(len(self.sets))]

    def replicas(self, pid: int) -> list[str]:
        """``table()[pid]``, alone."""
        s = self.sets[pid]
        return [self._lost[pid], *s.backups] if pid in self._lost else s.replicas()

    def view(self) -> "TableView":
        """``table()``, each partition's built when read (a handover reads one, or all only when it needs more replicas)."""
        return TableView(self)

    def _publish(self, pid: int) -> Publish:
        s = self.sets[pid]
        s.epoch += 1
        return Publish(pid, s.epoch, s.primary, tuple(s.backups), tuple(sorted(s.in_sync)))

    def _remove(self, pid: int, node: str) -> None:
        s = self.sets[pid]
        s.backups.remove(node)
        s.in_sync.discard(node)
        self.copying.discard((pid, node))

    # -- planned steps -----------------------------------------------------------

    def add_backup(self, pid: int, node: str) -> list[Action]:
        s = self.sets[pid]
        if s.primary is None or node in s.replicas():
            return []
        s.backups.append(node)
        return [self._publish(pid), CatchUp(pid, node, s.primary)]

    def reserve(self, pid: int, nodes: Iterable[str]) -> None:
        self.reserved[pid] = set(nodes)

    def release(self, pid: int) -> None:
        self.reserved.pop(pid, None)

    def promote(self, pid: int, node: str, source: str) -> list[Action]:
        s = self.sets[pid]
        if s.primary != source or pid in self._lost or node not in s.backups:
            return []
        self._remove(pid, node)
        s.in_sync.discard(source)
        s.primary = node
        s.in_sync.add(node)
        # a backup out of sync has no position in the new primary's stream: it copies from the new primary now
        return [self._publish(pid), *(CatchUp(pid, b, node) for b in s.backups if b not in s.in_sync)]

    def drop(self, pid: int, node: str) -> list[Action] | None:
        s = self.sets[pid]
        if pid in self._lost:
            return None  # a candidate: wait for the election
        if node not in s.backups:
            return []
        if node in self.reserved.get(pid, ()):
            return None  # the handover that added it ends first
        catching_up = any(b not in s.in_sync for b in s.backups if b != node)
        if node in s.in_sync and catching_up and len(s.in_sync) - 1 < self.backup_count + 1:
            return None  # wait until the new replica is in sync
        self._remove(pid, node)
        return [self._publish(pid)]

    # -- the primary's reports -----------------------------------------------------

    def caught_up(self, pid: int, node: str, epoch: int) -> list[Action]:
        s = self.sets[pid]
        if epoch != s.epoch or node not in s.backups or node in s.in_sync:
            return []
        if (pid, node) in self.copying:
            return [self._publish(pid)]  # refused; the bump tells the primary to stop waiting for it
        s.in_sync.add(node)
        return [self._publish(pid)]

    def copy_started(self, pid: int, node: str) -> bool:
        s = self.sets[pid]
        if (pid, node) in self.copying or s.primary is None or node not in s.backups or node in s.in_sync:
            return False
        self.copying.add((pid, node))
        return True

    def copy_finished(self, pid: int, node: str) -> None:
        self.copying.discard((pid, node))

    def unreachable(self, pid: int, node: str, epoch: int) -> list[Action]:
        s = self.sets[pid]
        if s.primary is None or epoch != s.epoch or node not in s.in_sync or node == s.primary:
            return []
        s.in_sync.discard(node)
        return [self._publish(pid), CatchUp(pid, node, s.primary)]

    def diverged(self, pid: int, node: str, epoch: int) -> list[Action]:
        """The primary reports the backup holds no copy its stream can extend: out of the in-sync set as
        ``unreachable``, and a copy even when it was out already."""
        s = self.sets[pid]
        if s.primary is None or epoch != s.epoch or node not in s.backups:
            return []
        return self.unreachable(pid, node, epoch) if node in s.in_sync else [CatchUp(pid, node, s.primary)]

    # -- failures ------------------------------------------------------------------

    def members_dead(self, nodes: Iterable[str]) -> list[Action]:
        dead = set(nodes)
        actions: list[Action] = []
        for pid, s in enumerate(self.sets):
            if not dead & {s.primary, *s.backups}:
                continue
            for node in dead & set(s.backups):
                self._remove(pid, node)
            if s.primary in dead:
                self._lost[pid], s.primary = s.primary, None
                s.in_sync &= set(s.backups)
                s.backups = [b for b in s.backups if b in s.in_sync]  # the others lack acknowledged writes
            publish = self._publish(pid)
            if pid not in self._lost:
                actions.append(publish)
            elif s.backups:
                actions += [publish, AskPositions(pid, tuple(sorted(s.backups)))]
            else:
                actions += [publish, RestoreFromCheckpoint(pid, self._lost[pid])]
        return actions

    def positions(self, pid: int, answers: Mapping[str, int | None], now: float) -> list[Action]:
        s = self.sets[pid]
        if pid not in self._lost or not s.backups:
            return []
        without_copy = sorted(b for b in s.backups if b in answers and answers[b] is None)
        for b in without_copy:
            self._remove(pid, b)  # it answered but holds no copy (it is copying anew, or restarted): no candidate
        applied = cast(dict[str, int], {b: answers[b] for b in s.backups if answers.get(b) is not None})
        if applied:
            primaries = Counter(other.primary for other in self.sets)
            new = min(applied, key=lambda n: (-applied[n], primaries[n], n))
            s.primary, s.backups, s.in_sync = new, sorted(b for b in applied if b != new), set(applied)
            self._asked_since.pop(pid, None)
            publish = self._publish(pid)
            return [publish, Promoted(pid, self._lost.pop(pid), new, publish.epoch)]
        if not s.backups:
            reason = f"its in-sync backups {without_copy} hold no copy"
        elif now - self._asked_since.setdefault(pid, now) > self.election_timeout:
            reason = f"no in-sync backup of {sorted(s.backups)} answered within {self.election_timeout:g}s"
            s.backups, s.in_sync = [], set()
        else:
            return [self._publish(pid)] if without_copy else []
        self._asked_since.pop(pid, None)
        return [self._publish(pid), RestoreFromCheckpoint(pid, self._lost[pid], reason)]

    def moved(self, pid: int, node: str) -> list[Action]:
        s = self.sets[pid]
        self._lost.pop(pid, None)
        self._asked_since.pop(pid, None)
        s.primary, s.backups, s.in_sync = node, [b for b in s.backups if b != node], {node}
        return [self._publish(pid), *(CatchUp(pid, b, node) for b in s.backups)]

    def leave(self, pid: int, node: str) -> list[Action]:
        s = self.sets[pid]
        if node not in s.backups:
            return []
        self._remove(pid, node)
        return [self._publish(pid)]

    def returned(self, node: str) -> list[Action]:
        actions: list[Action] = []
        for pid in [pid for pid, lost in self._lost.items() if lost == node]:
            actions += self.moved(pid, node)  # its copy is the most advanced; the backups catch up anew
        return actions

    def lost(self) -> dict[int, str]:
        """Partitions without a primary -> the dead one."""
        return dict(self._lost)

    def to_wire(self) -> dict:
        return {"sets": [[s.primary, s.backups, sorted(s.in_sync), s.epoch] for s in self.sets],
                "lost": {str(pid): node for pid, node in self._lost.items()}}

    @classmethod
    def from_wire(cls, backup_count: int, data: dict) -> "InSyncSets":
        sets = cls(backup_count, [])
        sets.sets = [ReplicaSet(primary, list(backups), set(in_sync), epoch) for primary, backups, in_sync, epoch in data["sets"]]
        sets._lost = {int(pid): node for pid, node in data["lost"].items()}
        return sets

    def restored(self, pid: int, node: str) -> list[Action]:
        s = self.sets[pid]
        if pid not in self._lost or s.backups:
            return []
        del self._lost[pid]
        s.primary, s.backups, s.in_sync = node, [], {node}
        return [self._publish(pid)]


class TableView(Sequence[list[str]]):
    """``InSyncSets.table()`` as a sequence that builds each partition's entry when it is read."""

    def __init__(self, sets: InSyncSets) -> None:
        self._sets = sets

    def __len__(self) -> int:
        return len(self._sets.sets)

    @overload
    def __getitem__(self, pid: int) -> list[str]: ...
    @overload
    def __getitem__(self, pid: slice) -> list[list[str]]: ...

    def __getitem__(self, pid: int | slice) -> list[str] | list[list[str]]:
        if isinstance(pid, slice):
            return self._sets.table()[pid]
        return self._sets.replicas(pid)
