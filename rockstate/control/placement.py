"""Where partitions should live: the coordinator's planner, from the table's owners and the members' statuses.

- ``rebalance``: the moves that balance the table over the ALIVE members
  (``assignment.assign``), in partition order. Partitions of DEAD members
  stay where they are: moving them without their data would lose it; they
  wait for their node, or for a failover.
- ``unassigned``: of those moves, the ones without a source (a new
  cluster's placement, a partition never assigned) need no copy: their
  new owners go out in one table, not a table per partition.
- ``failover``: a DEAD member's partitions, each with the live member that
  restores it from the latest checkpoint (the owner ``assign`` gives it).
  None while no member is alive (the failover waits); an empty plan when
  there is nothing left to restore (the member came back, or its partitions
  are elsewhere already).
- ``by_owner``: each owner with its partitions, when every one has a live
  owner (a checkpoint or a restore needs all of them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from ..errors import PartitionUnavailableError
from .assignment import assign
from .membership import MemberStatus

Owners = Sequence[str | None]
Statuses = Mapping[str, MemberStatus]


@dataclass(frozen=True)
class Move:
    partition: int
    source: str | None  # None: unassigned, nothing to copy
    target: str


@dataclass(frozen=True)
class FailoverPlan:
    new_owner: dict[int, str] = field(default_factory=dict)  # a lost partition -> the member restoring it

    def by_target(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for pid, target in self.new_owner.items():
            out.setdefault(target, []).append(pid)
        return out

    def owners(self, old: Owners) -> list[str | None]:
        return [self.new_owner.get(pid, owner) for pid, owner in enumerate(old)]


def _alive(statuses: Statuses) -> list[str]:
    return [nid for nid, status in statuses.items() if status is MemberStatus.ALIVE]


def rebalance(owners: Owners, statuses: Statuses) -> list[Move]:
    targets = _alive(statuses)
    if not targets:
        return []
    movable = [pid for pid, o in enumerate(owners) if o is None or statuses[o] is not MemberStatus.DEAD]
    current = [owners[pid] if owners[pid] in targets else None for pid in movable]
    return [Move(pid, owners[pid], new) for pid, new in zip(movable, assign(current, targets)) if new != owners[pid]]


def unassigned(moves: Sequence[Move]) -> tuple[dict[int, str], list[Move]]:
    """The moves without a source as {partition: new owner}; the moves that copy."""
    return {m.partition: m.target for m in moves if m.source is None}, [m for m in moves if m.source is not None]


def failover(owners: Owners, statuses: Statuses, dead: str) -> FailoverPlan | None:
    lost = [pid for pid, o in enumerate(owners) if o == dead]
    if not lost or statuses[dead] is not MemberStatus.DEAD:
        return FailoverPlan()
    targets = _alive(statuses)
    if not targets:
        return None
    wanted = assign([o if o in targets else None for o in owners], targets)
    return FailoverPlan({pid: wanted[pid] for pid in lost})


def by_owner(owners: Owners, statuses: Statuses) -> list[tuple[str, list[int]]]:
    out: dict[str | None, list[int]] = {}
    for pid, owner in enumerate(owners):
        out.setdefault(owner, []).append(pid)
    missing = [pid for o, pids in out.items() if o is None or statuses[o] is not MemberStatus.ALIVE for pid in pids]
    if missing:
        raise PartitionUnavailableError(
            f"partitions {missing[:8]}{' and more' if len(missing) > 8 else ''} have no live owner ({len(missing)} in all): "
            "retry once their node returns or they are restored from a checkpoint (rockstate status shows them)",
            partitions=missing[:64])
    return [(o, pids) for o, pids in out.items()]  # type: ignore[misc]
