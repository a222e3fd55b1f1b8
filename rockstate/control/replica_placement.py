"""Where each partition's replicas should live: a primary and ``backup_count`` backups, and the steps that get there.

``plan(replicas, statuses, backup_count, zones)``: ``replicas[pid]`` is the
partition's current ``[primary, backup, ...]`` (empty: unassigned); answers a
``ReplicaPlan``: the target replica sets and the ordered steps that reach them.

Rules:

- Primaries are placed exactly as ``placement.rebalance`` places owners:
  ``assign`` over the ALIVE members; a partition whose primary is DEAD is left
  as it is (``InSyncSets.members_dead`` promotes one of its backups first).
  With ``backup_count=0`` the plan is today's table, move for move.
- Backups are balanced separately: over the partitions being planned, each
  ALIVE member holds q or q + 1 backups (q, r = divmod(backups wanted,
  members)), the r larger shares going to the members holding the most
  backups now. A backup is never its partition's primary nor a second copy
  on one member; when the ALIVE members span at least ``backup_count + 1``
  zones, a partition's replicas are in distinct zones (a member without a
  zone label is a zone of its own); with fewer zones, shared zones are
  avoided where possible.
- Fewest changes: a current replica (a backup, or a primary that lost its
  place) stays on as a backup where these rules allow, its old backups
  first and lower-numbered partitions first; the missing backups go to the
  least-loaded member allowed; then backups pass from members above their
  share (or two above another member) to members below it, where the zone
  rule allows, so the shares are even (within a zone, when zones make
  members unequal). Fewer ALIVE members than ``backup_count + 1``:
  as many backups as there are other members (``ReplicaPlan.missing``).
- Few peers per primary (a copyset's scatter width; Cassandra's ring
  successors): once the rules above have placed every backup, the backups this
  plan adds are swapped between partitions so that as many as can sit on their
  primary's *successors* -- the next ``backup_count + 1`` ALIVE members after
  it in id order (of other zones when zones are strict) -- each member's load,
  the number of copies and the rules above unchanged (``scatter``). A primary
  sends each request's batches to every member holding a backup of one of its
  partitions: spread over all members, 16 nodes at P=1024 sent 240
  ``ReplicaApply`` a 5,000-key batch (16 x 15), each waking two processes.
  A member's death promotes its partitions on its successors; the primaries'
  rebalance hands the excess on. Backups a plan keeps stay where they are
  (fewest copies): a partition keeps its backups when its primary moves.

Steps, per partition, in this order, each begun once the one before is done:
``ADD`` a replica (it copies the partition from the primary, a
snapshot and the write delta, until it is in sync; with no primary it
starts empty), ``PROMOTE`` an in-sync replica to primary (an epoch bump),
``DROP`` a replica. Adds precede drops, so a partition never has fewer
in-sync replicas during a change than before it.

``under_way(replicas, handovers, intended)``: the sets a plan starts from
while changes are under way: as the handovers and the steps begun will leave
them (a plan of the sets half-way undoes what the last one began).

``handover_adds(...)``: the replicas to add before a primary moves by a
handover (``migration.Handover``), which takes its old primary out of the
set: the target if it is no replica yet, and as many more as keep
``backup_count + 1`` in-sync replicas without the old one (those the plan
gives the partition first, then the least-loaded ALIVE members), as far as
the members allow.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Callable, Mapping, Sequence

from .assignment import assign
from .membership import MemberStatus
from .placement import Move

Replicas = Sequence[Sequence[str]]


class StepKind(StrEnum):
    ADD = "add"
    PROMOTE = "promote"
    DROP = "drop"


@dataclass(frozen=True)
class ReplicaStep:
    partition: int
    kind: StepKind
    node: str


@dataclass(frozen=True)
class ReplicaPlan:
    target: list[list[str]]  # partition -> [primary, backups...]
    steps: list[ReplicaStep] = field(default_factory=list)
    missing: dict[int, int] = field(default_factory=dict)  # partition -> backups it lacks (too few members)

    def moves(self, replicas: Replicas) -> list[Move]:
        """The primaries that change, as ``placement.rebalance`` names them."""
        return [Move(pid, old[0] if old else None, new[0])
                for pid, (old, new) in enumerate(zip(replicas, self.target)) if new and (old[:1] != new[:1])]


def plan(replicas: Replicas, statuses: Mapping[str, MemberStatus], backup_count: int,
         zones: Mapping[str, str] | None = None) -> ReplicaPlan:
    alive = sorted(n for n, s in statuses.items() if s is MemberStatus.ALIVE)
    current = [list(r) for r in replicas]
    if not alive:
        return ReplicaPlan(current)
    primaries = [r[0] if r else None for r in current]
    movable = [pid for pid, p in enumerate(primaries) if p is None or statuses.get(p) is not MemberStatus.DEAD]
    live = set(alive)  # a set: ``in`` a list of 1,000 members per partition was half of a plan's time at P=10,000
    new_primary = dict(zip(movable, assign([primaries[pid] if primaries[pid] in live else None for pid in movable], alive)))
    backups = _Backups(alive, zones or {}, min(backup_count, len(alive) - 1), current, movable)
    target = [list(r) for r in current]
    # keep old replicas first where the members short of backups may not go (their primary is there)
    closed = [backups.closed_to_short(new_primary[pid]) for pid in movable]
    first = [pid for pid, c in zip(movable, closed) if c] + [pid for pid, c in zip(movable, closed) if not c]
    kept = {pid: backups.keep(new_primary[pid], current[pid][1:] + current[pid][:1]) for pid in first}
    for pid in movable:
        chosen = kept[pid]
        target[pid] = [new_primary[pid], *chosen, *(backups.fill(new_primary[pid], chosen) if len(chosen) < backups.count else ())]
    backups.even_out(target, movable)
    backups.scatter(target, current, movable)
    missing = {pid: backup_count - (len(target[pid]) - 1) for pid in movable if len(target[pid]) - 1 < backup_count}
    return ReplicaPlan(target, _steps(current, target), missing)


class _Backups:
    """Backup loads and caps over the ALIVE members, and the zone rule."""

    def __init__(self, alive: list[str], zones: Mapping[str, str], count: int,
                 current: list[list[str]], movable: list[int]) -> None:
        self.alive, self.count = alive, count
        self.zone = {n: zones.get(n, n) for n in alive}
        self.strict = len(set(self.zone.values())) >= count + 1  # enough zones: one replica per zone
        held = dict.fromkeys(self.alive, 0)
        for pid in movable:
            for n in current[pid][1:]:
                if n in held:
                    held[n] += 1
        q, r = divmod(self.count * len(movable), len(self.alive))
        by_load = sorted(self.alive, key=lambda n: (-held[n], n))
        self.cap = {n: q + (1 if i < r else 0) for i, n in enumerate(by_load)}
        self.short = [n for n in alive if held[n] < self.cap[n]]
        self.load = dict.fromkeys(self.alive, 0)
        self._order: list[tuple[int, str]] | None = None
        self._closed: dict[str, bool] = {}  # per primary: a plan asks it once per partition, of a few members
        self._successors: dict[str, list[str]] = {}

    def successors(self, primary: str) -> list[str]:
        """The ``count + 1`` ALIVE members after ``primary`` in id order (of other zones when zones are strict): where
        its partitions' backups go first. Made once per primary a plan."""
        found = self._successors.get(primary)
        if found is None:
            alive, zone = self.alive, self.zone.get(primary, primary)
            start = bisect_left(alive, primary) + (primary in self.zone)
            found = self._successors[primary] = []
            for k in range(len(alive)):  # a few steps: the ring is walked only as far as it takes
                n = alive[(start + k) % len(alive)]
                if n != primary and not (self.strict and self.zone[n] == zone):
                    found.append(n)
                    if len(found) > self.count:
                        break
        return found

    def closed_to_short(self, primary: str) -> bool:
        closed = self._closed.get(primary)
        if closed is None:
            closed = self._closed[primary] = not any(self._allowed(n, primary, []) for n in self.short)
        return closed

    def _allowed(self, node: str, primary: str, chosen: list[str]) -> bool:
        taken = [primary, *chosen]
        return node in self.zone and node not in taken and not (
            self.strict and self.zone[node] in {self.zone[n] for n in taken})

    def keep(self, primary: str, candidates: list[str]) -> list[str]:
        """``_allowed`` and the cap, spelled out: a plan calls this once per partition (a third of its time at P=10,000)."""
        chosen: list[str] = []
        load, cap, zone = self.load, self.cap, self.zone
        zones_taken = {zone[primary]} if self.strict else set()
        for node in candidates:
            if len(chosen) == self.count:
                break
            limit = cap.get(node)  # None: not an ALIVE member
            if limit is None or load[node] >= limit or node == primary or node in chosen or zone[node] in zones_taken:
                continue
            chosen.append(node)
            load[node] += 1
            if self.strict:
                zones_taken.add(zone[node])
        return chosen

    def fill(self, primary: str, chosen: list[str]) -> list[str]:
        added: list[str] = []
        if self._order is None:  # members by (load, id), kept in order as fill adds (keep() is done by now)
            self._order = sorted((load, n) for n, load in self.load.items())
        while len(chosen) + len(added) < self.count:
            taken = [*chosen, *added]
            zones_taken = {self.zone[n] for n in [primary, *taken]}
            # the usual best, found in a few steps rather than over every member: the first in (load, id) order
            # under its cap, in a zone not taken, and allowed -- the minimum of the key below when there is one
            best = next((n for _, n in self._order if self.load[n] < self.cap[n] and self.zone[n] not in zones_taken
                         and self._allowed(n, primary, taken)), None)
            if best is None:
                options = [n for n in self.alive if self._allowed(n, primary, taken)]
                if not options:
                    break
                best = min(options, key=lambda n: (self.load[n] >= self.cap[n], self.zone[n] in zones_taken, self.load[n], n))
            added.append(best)
            del self._order[bisect_left(self._order, (self.load[best], best))]
            self.load[best] += 1
            insort(self._order, (self.load[best], best))
        return added

    def scatter(self, target: list[list[str]], current: list[list[str]], movable: list[int]) -> None:
        """Swap backups this plan adds between two partitions: one lands on a successor of its primary, the other
        (on none of its own primary's) takes its place where the rules allow; every member's load stays."""
        successors = self.successors
        added = [(pid, i) for pid in movable for i, n in enumerate(target[pid][1:], 1) if n not in current[pid]]
        astray: dict[str, list[tuple[int, int]]] = {}  # member -> added backups it holds off their primary's successors
        for pid, i in added:
            if target[pid][i] not in successors(target[pid][0]):
                astray.setdefault(target[pid][i], []).append((pid, i))
        for pid, i in added:
            replicas = target[pid]
            holder, mine = replicas[i], successors(replicas[0])
            if holder in mine:
                continue
            rest = [n for n in replicas[1:] if n != holder]
            for other in mine:
                partner = self._partner(astray.get(other, []), other, holder, target) \
                    if self._allowed(other, replicas[0], rest) else None
                if partner is not None:
                    pid2, i2 = partner
                    replicas[i], target[pid2][i2] = other, holder
                    if holder not in successors(target[pid2][0]):
                        astray.setdefault(holder, []).append(partner)
                    break

    def _partner(self, astray: list[tuple[int, int]], other: str, holder: str,
                 target: list[list[str]]) -> tuple[int, int] | None:
        """A backup in ``astray`` (held by ``other``, off its primary's successors) that ``holder`` may take instead;
        those moved meanwhile are dropped from the list as found."""
        for k in range(len(astray) - 1, -1, -1):
            pid, i = astray[k]
            replicas = target[pid]
            if replicas[i] != other:
                del astray[k]
            elif self._allowed(holder, replicas[0], [n for n in replicas[1:] if n != other]):
                del astray[k]
                return pid, i
        return None

    def even_out(self, target: list[list[str]], movable: list[int]) -> None:
        """Hand backups from members over their cap, or two above another, to those under (the zone rule permitting)."""
        moved = True
        while moved:
            moved = False
            lowest = min(self.load.values())
            for pid in reversed(movable):
                replicas = target[pid]
                for i, node in enumerate(replicas[1:], 1):
                    if self.load[node] - lowest < 2 and self.load[node] <= self.cap[node]:
                        continue  # no member can take it (the test below on every member would find none): O(1), not O(N)
                    others = replicas[1:i] + replicas[i + 1:]
                    under = [n for n in self.alive if self._allowed(n, replicas[0], others) and (
                        self.load[node] - self.load[n] >= 2
                        or self.load[node] > self.cap[node] and self.load[n] < self.cap[n])]
                    if under:
                        replicas[i] = min(under, key=lambda n: (self.load[n], n))
                        self.load[node] -= 1
                        self.load[replicas[i]] += 1
                        moved = True
                        lowest = min(self.load.values())


def handover_adds(replicas: Replicas, pid: int, source: str, target: str, in_sync: set[str],
                  statuses: Mapping[str, MemberStatus], backup_count: int, zones: Mapping[str, str] | None = None,
                  wanted: Callable[[], Sequence[str]] | None = None,
                  held: Callable[[], Mapping[str, int]] | None = None) -> list[str]:
    """``wanted()``: the replicas a plan gives the partition (default: a ``plan`` of ``replicas`` now, O(P): a caller
    handing over many partitions at once passes one plan's answer for all of them); ``held()``: how many replicas
    each node holds, the tie-break among the free nodes (default: counted from ``replicas``, O(P), as ``wanted``)."""
    current = set(replicas[pid])
    adds = [] if target in current else [target]
    need = backup_count + 1 - len((set(in_sync) | {target}) - {source})
    if need <= 0:
        return adds
    load = held() if held is not None else Counter(n for r in replicas for n in r)
    free = [n for n, s in sorted(statuses.items()) if s is MemberStatus.ALIVE and n not in current and n not in adds]
    planned = wanted() if wanted is not None else plan(replicas, statuses, backup_count, zones).target[pid]
    free.sort(key=lambda n: (n not in planned, load[n], n))
    return adds + free[:need]


def under_way(replicas: Replicas, handovers: Mapping[int, tuple[str, str]], intended: Mapping[int, Sequence[str]]
              ) -> tuple[list[list[str]], dict[int, list[str]], dict[int, list[str]]]:
    """The replica sets as the changes under way will leave them, for ``plan``: a handover's (``handovers``: pid ->
    (source, target)) ends with the target primary and the source gone; a partition whose replicas were added for
    ``intended[pid]`` (a plan's target) ends there once its drops are done. Planned from the sets half-way, with a
    new replica beside the one it replaces, a plan kept the old and put the backup elsewhere, which the next plan
    undid: a P=1024 join made 690 copies where 512 do.

    Answers the sets; per partition, the replicas still to drop; and the intended sets still under way (one
    reached, or undone -- a replica gone, another primary, a handover -- is not)."""
    view = [list(r) for r in replicas]
    for pid, (source, target) in handovers.items():
        view[pid] = [target, *(n for n in view[pid] if n not in (source, target))]
    due: dict[int, list[str]] = {}
    going: dict[int, list[str]] = {}
    for pid, aim in intended.items():
        now = view[pid]
        if pid in handovers or not now or now[0] != aim[0] or not set(aim) <= set(now) or len(now) == len(aim):
            continue
        due[pid] = [n for n in now if n not in aim]
        going[pid] = view[pid] = list(aim)
    return view, due, going


def _steps(current: list[list[str]], target: list[list[str]]) -> list[ReplicaStep]:
    steps: list[ReplicaStep] = []
    for pid, (old, new) in enumerate(zip(current, target)):
        if old == new:  # most partitions, after any one event
            continue
        steps += [ReplicaStep(pid, StepKind.ADD, n) for n in new if n not in old]
        if new and old[:1] != new[:1]:
            steps.append(ReplicaStep(pid, StepKind.PROMOTE, new[0]))
        steps += [ReplicaStep(pid, StepKind.DROP, n) for n in old if n not in new]
    return steps
