"""A node's view of the partitions it may serve: ownership, the epoch check, the lease, moves out.

Every data request names the client's table epoch; ``check`` answers the
partition when this node may serve it, and raises otherwise:

- out of range: ``PartitionRangeError``;
- FENCED, the lease ran out (the node has not heard from the coordinator for
  ``lease`` seconds, half the coordinator's ``heartbeat_timeout``):
  ``PartitionUnavailableError``, retryable. The coordinator declares a node
  dead only after a whole timeout, so a node cut off from it has stopped
  serving before its partitions are restored elsewhere;
- not owned, released, or owned only since a later epoch than the
  request's (a client routing by a table from before a move):
  ``NotOwnerError`` with the node's table epoch.

States of one partition on this node::

      table names it              copy()                 delta(final)
    ──────────────▶ SERVING ─────────────▶ COPYING ───────────────▶ HANDED_OVER
                      ▲ │ ◀── discard() (the move failed) ──┘ │            │
                      │ │                                       │            │ release()
                      │ └───────────────── release() ───────────┴─────▶ RELEASED
                      │                                                    │
                      └──── (thaw(), then a table that names it) ◀─────────┘
    any state ── a table that names another owner ──▶ gone (its files are retired)

- ``apply_table``: partitions the table names elsewhere are retired at
  once; those it gives this node start SERVING, at the epoch it names for
  them (``since``), once the node has opened them (``opened``). A RELEASED partition is not served again even by a table that
  still names this node (another move's commit, sent before this one's):
  only ``thaw`` (from a restarted coordinator) gives it back.
- ``copy``: the move's source took a copy and records writes from now on
  (an ingest, which cannot be recorded, is refused meanwhile).
- ``delta(final=True)``: the last delta is taken; recording ends.
- ``release``: the new owner is about to be committed; requests get
  NOT_OWNER from now on.

Frozen is orthogonal: ``freeze`` makes writes to a partition wait (reads go
on) while it moves or is restored; ``unfreeze``, ``release``, a table that
takes the partition away, or ``thaw`` lift it. Writers wait outside, in the
server; ``frozen`` tells them whether to.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Sequence

from ..errors import NotOwnerError, PartitionRangeError, PartitionUnavailableError


class Phase(StrEnum):
    SERVING = "serving"
    COPYING = "copying"  # moving out: a copy is taken, writes are recorded for the target
    HANDED_OVER = "handed_over"  # moving out: the last delta is taken
    RELEASED = "released"  # not served; waits for the table that names the new owner


@dataclass(frozen=True)
class TableChange:
    """What the node does for a new table: open these partitions, retire (close and drop) those."""

    opened: tuple[int, ...] = ()
    retired: tuple[int, ...] = ()


class Ownership:
    def __init__(self, node_id: str | None = None, partitions: int = 0, lease: float = 1.0) -> None:
        self.node_id = node_id
        self.partitions = partitions
        self.lease = lease  # seconds a heartbeat's answer lets the node serve
        self.lease_until = 0.0  # monotonic time until which it may serve
        self.epoch = 0  # of the last table applied
        self.owners: tuple[str | None, ...] = ()
        self.since: dict[int, int] = {}  # partition -> epoch it became this node's (released ones too)
        self.phase: dict[int, Phase] = {}
        self.frozen: set[int] = set()
        self._opening: dict[int, int] = {}  # partitions the last table gave, not open yet -> their since

    def join(self, node_id: str, partitions: int, lease: float, sent: float) -> None:
        """The coordinator registered this node (a registration sent at ``sent``)."""
        self.node_id, self.partitions, self.lease = node_id, partitions, lease
        self.renewed(sent)

    # -- the lease ---------------------------------------------------------------

    def renewed(self, sent: float) -> None:
        """The coordinator answered a heartbeat (or registration) sent at ``sent``. Never shortens the lease: a
        heartbeat's renewal may come after a later one's (it waited for the newer table it named to be applied)."""
        self.lease_until = max(self.lease_until, sent + self.lease)

    # -- the table ---------------------------------------------------------------

    def apply_table(self, epoch: int, owners: Sequence[str | None], since: Sequence[int]) -> TableChange | None:
        """A table; None when it is not newer than the last one."""
        if self.owners and epoch <= self.epoch:
            return None
        named = {pid for pid, owner in enumerate(owners) if owner == self.node_id}
        retired = tuple(sorted(set(self.phase) - named))
        for pid in retired:
            self._forget(pid)
        opened = tuple(sorted(named - set(self.phase)))
        self._opening = {pid: since[pid] for pid in opened}
        for pid, phase in self.phase.items():  # one moving out goes on moving
            if pid in named and phase is not Phase.RELEASED:
                self.since[pid] = since[pid]
        self.epoch, self.owners = epoch, tuple(owners)
        return TableChange(opened, retired)

    def opened(self, pid: int) -> None:
        """A partition the last table gave this node is open: it is SERVING from now on (not before)."""
        self.since[pid], self.phase[pid] = self._opening.pop(pid), Phase.SERVING

    def _forget(self, pid: int) -> None:
        self.since.pop(pid, None)
        self.phase.pop(pid, None)
        self.frozen.discard(pid)

    def owned(self) -> list[int]:
        """Partitions this node serves (moving out ones too, not released ones)."""
        return sorted(pid for pid, phase in self.phase.items() if phase is not Phase.RELEASED)

    def owns(self, pid: object) -> bool:
        return self.phase.get(pid) not in (None, Phase.RELEASED)  # type: ignore[call-overload]

    # -- requests ----------------------------------------------------------------

    def check_range(self, pid: object) -> int:
        if type(pid) is not int or not 0 <= pid < self.partitions:
            raise PartitionRangeError(f"partition {pid!r} is out of range 0..{self.partitions - 1}")
        return pid

    def check(self, pid: object, epoch: int, now: float, leased: bool = True) -> int:
        """The partition, if this node may serve it at ``epoch`` (and, for client requests, holds its lease)."""
        pid = self.check_range(pid)
        if leased and now > self.lease_until:
            silent = now - self.lease_until + self.lease
            raise PartitionUnavailableError(
                f"node {self.node_id} has not heard from the coordinator for {silent:.1f}s (lease {self.lease:g}s); "
                f"it serves partition {pid} again once it does", partition=pid)
        phase = self.phase.get(pid)
        if phase is None or phase is Phase.RELEASED or epoch < self.since[pid]:
            raise NotOwnerError(
                f"node {self.node_id} does not own partition {pid} at epoch {epoch} "
                f"(owner: {self.owners[pid] if self.owners else None}, table epoch {self.epoch})",
                partition=pid, epoch=self.epoch)
        return pid

    def check_owned(self, pid: object) -> int:
        """The partition, if this node owns it at all (a move's source answering its target)."""
        pid = self.check_range(pid)
        if not self.owns(pid):
            raise NotOwnerError(f"node {self.node_id} does not own partition {pid}", partition=pid, epoch=self.epoch)
        return pid

    def check_ingest(self, pid: int, epoch: int) -> None:
        """An ingest about to happen (under the partition's write lock): still ours, and not being copied."""
        if not self.owns(pid) or epoch < self.since[pid]:  # it moved away while the file was checked
            raise NotOwnerError(f"node {self.node_id} does not own partition {pid} any more", partition=pid, epoch=self.epoch)
        if self.phase[pid] is not Phase.SERVING:
            raise PartitionUnavailableError(f"partition {pid} is being copied to another node; retry", partition=pid)

    # -- moving out ----------------------------------------------------------------

    def copy(self, pid: object) -> int:
        pid = self.check_owned(pid)
        self.phase[pid] = Phase.COPYING
        return pid

    def delta(self, pid: object, final: bool) -> int:
        pid = self.check_owned(pid)
        if final:
            self.phase[pid] = Phase.HANDED_OVER
        return pid

    def discard(self, pid: int) -> None:
        """The move failed: the partition serves on, unrecorded."""
        if self.owns(pid):
            self.phase[pid] = Phase.SERVING

    def release(self, pid: object) -> bool:
        """Stop serving; whether it was served. Its files stay until a table names the new owner."""
        pid = self.check_range(pid)
        if not self.owns(pid):
            return False
        self.phase[pid] = Phase.RELEASED
        self.frozen.discard(pid)
        return True

    def freeze(self, pid: object) -> None:
        self.frozen.add(self.check_range(pid))

    def unfreeze(self, pid: object) -> None:
        self.frozen.discard(pid)

    def thaw(self) -> list[int]:
        """A restarted coordinator: no move is in flight. Answers the owned partitions (their move copies go)."""
        self.frozen.clear()
        for pid, phase in list(self.phase.items()):
            if phase is Phase.RELEASED:  # served again once the next table names it
                self._forget(pid)
            else:
                self.phase[pid] = Phase.SERVING
        return self.owned()
