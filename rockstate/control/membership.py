"""The coordinator's members: who they are, where they listen, whether they are alive.

States of one member::

                 ┌── silent for suspect_after (suspects()) ──▶ (SUSPECT) ─┐ heard again (heartbeat(): next suspects())
                 │                                                        ▼
    register() ──▶ ALIVE ── silent for heartbeat_timeout (expire()) ──▶ DEAD
                   ▲  │ ◀──────────── heartbeat() or register() ────────┘
                   │  └── leave(others=True) ──▶ LEAVING ── left() ──▶ LEFT
                   │                               └── leave_failed() ──▶ DEAD
                   │  └── leave(others=False): the last node ──▶ DEAD
                   └──────────────── register() ◀── LEFT (a new start)
    ALIVE ── leave(drain=True) ──▶ LEAVING ── left() ──▶ DRAINED ── undrain() ──▶ ALIVE
                                     └── leave_failed() ──▶ ALIVE (a drain's node still runs)
    DEAD, LEFT, DRAINED (silent) ── remove() ──▶ forgotten

- ``register(node_id, address, now)``: a new id (``node-N``) when the node
  has none or is unknown under it; answers the id and whether it joined
  (False: a known member returned).
- ``heartbeat(node_id, now)``: keeps a member alive; answers True when it
  was DEAD (cut off, not gone: partitions restored elsewhere meanwhile stay
  there). A LEFT or unknown member is told to register again
  (``UnknownNodeError``).
- ``expire(now)``: the ALIVE members silent for longer than the timeout
  become DEAD; answers them. When the caller itself did not run for more
  than half the timeout since the previous call (its process was stalled: a
  loaded machine), their heartbeats may wait unread in its sockets, so
  nobody expires then and every member's silence is counted from after the
  stall.
- ``suspects(now)``: an ALIVE member silent for longer than ``suspect_after``
  (a third of the timeout: at least two of the node's heartbeat intervals,
  which are at most a third of its lease, half the timeout) is SUSPECT; one
  heard from again (``heartbeat``) is not. Answers the members that became
  suspect and those that stopped being so since the previous call (a member
  declared dead meanwhile is neither: it is dead). SUSPECT is shown, never
  acted on: the member's ``status`` stays ALIVE (``Member.shown`` is
  ``"suspect"``), so placement, replicas and leases treat it as alive until
  ``expire`` declares it dead. A stall of the caller itself is not the
  members' silence: when it did not run for more than half of
  ``suspect_after`` since its previous call, nobody becomes suspect in this
  one (their heartbeats may wait unread in its sockets).
- ``leave`` / ``left``: a graceful leave; a LEAVING member still gets the
  table (its partitions move off it) but is not a target. ``leave_failed``:
  its partitions could not all move off it; it exits all the same, so it is
  DEAD (what stayed on it goes to its backups or the checkpoint).
- ``leave(drain=True)``: a drain, asked by an operator for a node that keeps
  running: it ends DRAINED, not LEFT. A DRAINED member is heard (heartbeats,
  a registration after its restart or the coordinator's) but never a target
  of partitions or backups, whatever rebalances, until ``undrain`` (only
  while it is heard: a silent one would be declared dead at once); it never
  expires (it holds nothing). Its own leave as its process stops moves
  nothing (``stopped`` until it registers again: a heartbeat sent as it left
  may arrive after its leave). A drain that fails leaves it
  ALIVE: it still serves what did not move.
- ``remove(node_id, now, holds)``: forget a member for good. Refused
  (``MembershipChangeError``) for an ALIVE or LEAVING member (drain it
  first), a DRAINED one whose process runs (heard within the timeout and
  not stopped: it would only come back), and one that still ``holds``
  partitions (a dead node's not yet promoted or restored elsewhere: they
  would be lost).

A restarted coordinator loads the members with ``last_seen`` = now, giving
each a whole timeout to check in.

``needs_restart(current)``: a node takes some of the coordinator's settings
only when it registers (``Member.settings``: the key and value limits, the
heartbeat timeout its lease is half of); the members heard from whose
settings differ from ``current`` (the coordinator was restarted with other
values) and which of them, so the status can say which processes to restart.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ..errors import MembershipChangeError, UnknownNodeError


SUSPECT_FRACTION = 3  # suspect after heartbeat_timeout / 3 of silence (dead after all of it)
SUSPECT = "suspect"  # the shown state of an ALIVE member silent for longer than suspect_after


class MemberStatus(StrEnum):
    ALIVE = "alive"
    DEAD = "dead"
    LEAVING = "leaving"
    LEFT = "left"
    DRAINED = "drained"


@dataclass
class Member:
    node_id: str
    address: str
    status: MemberStatus = MemberStatus.ALIVE
    last_seen: float = 0.0  # monotonic
    suspect: bool = False  # ALIVE and silent for longer than suspect_after (Membership.suspects)
    drain: bool = False  # LEAVING for a drain: it ends DRAINED (kept with the record, as the status is)
    stopped: bool = False  # DRAINED and said it stops (its own leave), not registered since
    settings: dict | None = None  # the coordinator's settings its registration gave it (None: not known, an older record)
    # the checkpoint storage URL its registration answered ("": none; None: not known, a record older than this field).
    # A node learns the storage only when it registers: one registered before the storage was set cannot checkpoint
    checkpoint_url: str | None = None

    @property
    def shown(self) -> str:
        """The state the status and the metrics show: ``status``, or "suspect" for a suspect ALIVE member."""
        return SUSPECT if self.suspect and self.status is MemberStatus.ALIVE else str(self.status)


class Membership:
    def __init__(self, heartbeat_timeout: float, members: dict[str, Member] | None = None, next_id: int = 1) -> None:
        self.heartbeat_timeout = heartbeat_timeout
        self.members: dict[str, Member] = members or {}
        self.next_id = next_id
        self._expired_at: float | None = None  # the previous expire()
        self._recovered: list[Member] = []  # suspect members heard from since the previous suspects()
        self._suspected_at: float | None = None  # the previous suspects()

    @property
    def suspect_after(self) -> float:
        return self.heartbeat_timeout / SUSPECT_FRACTION

    @classmethod
    def from_wire(cls, heartbeat_timeout: float, saved: dict, now: float) -> "Membership":
        members = {nid: Member(nid, m["address"], MemberStatus(m["status"]), now, checkpoint_url=m.get("checkpoint_url"),
                               drain=m.get("drain", False), settings=m.get("settings"))
                   for nid, m in saved.get("members", {}).items()}
        return cls(heartbeat_timeout, members, saved.get("next_id", 1))

    def to_wire(self) -> dict:
        return {"members": {m.node_id: {"address": m.address, "status": str(m.status),
                                        **({} if m.checkpoint_url is None else {"checkpoint_url": m.checkpoint_url}),
                                        **({"drain": True} if m.drain else {}),
                                        **({} if m.settings is None else {"settings": m.settings})}
                            for m in self.members.values()},
                "next_id": self.next_id}

    def __getitem__(self, node_id: str) -> Member:
        return self.members[node_id]

    def get(self, node_id: str | None) -> Member | None:
        return self.members.get(node_id) if node_id is not None else None

    def alive(self) -> list[Member]:
        return [m for m in self.members.values() if m.status is MemberStatus.ALIVE]

    def serving(self, node_id: str | None) -> bool:
        """Whether the node holds its partitions' data and answers: alive, or leaving."""
        m = self.get(node_id)
        return m is not None and m.status in (MemberStatus.ALIVE, MemberStatus.LEAVING)

    def addresses(self) -> dict[str, str]:
        return {m.node_id: m.address for m in self.members.values()}

    def statuses(self) -> dict[str, MemberStatus]:
        return {m.node_id: m.status for m in self.members.values()}

    # -- events ------------------------------------------------------------------

    def register(self, node_id: str | None, address: str, now: float) -> tuple[str, bool]:
        joined = node_id is None or node_id not in self.members
        if node_id is None:
            node_id = f"node-{self.next_id}"
            self.next_id += 1
        member = self.members.setdefault(node_id, Member(node_id, address))
        member.address, member.last_seen = address, now
        if member.status is not MemberStatus.DRAINED:  # a drained node stays drained across its restarts
            member.status = MemberStatus.ALIVE
        member.stopped = False  # a process that runs again registers first
        self._heard(member)
        return node_id, joined

    def heartbeat(self, node_id: str, now: float) -> bool:
        member = self.members.get(node_id)
        if member is None or member.status is MemberStatus.LEFT:
            raise UnknownNodeError(f"node {node_id} is not a member; register again")
        returned = member.status is MemberStatus.DEAD
        if returned:
            member.status = MemberStatus.ALIVE
        member.last_seen = now
        self._heard(member)
        return returned

    def _heard(self, member: Member) -> None:
        if member.suspect:
            member.suspect = False
            self._recovered.append(member)

    def expire(self, now: float) -> list[Member]:
        stalled = 0.0 if self._expired_at is None else now - self._expired_at
        self._expired_at = now
        if stalled > self.heartbeat_timeout / 2:
            for m in self.alive():
                m.last_seen = min(now, m.last_seen + stalled)
            return []
        dead = [m for m in self.alive() if now - m.last_seen > self.heartbeat_timeout]
        for m in dead:
            m.status, m.suspect = MemberStatus.DEAD, False
        return dead

    def suspects(self, now: float) -> tuple[list[Member], list[Member]]:
        """ALIVE members silent for longer than ``suspect_after`` become suspect. Answers (those that became
        suspect, the suspect ones heard from again since the previous call and still alive)."""
        recovered = [m for m in self._recovered if m.status is MemberStatus.ALIVE and not m.suspect]
        self._recovered = []
        stalled = 0.0 if self._suspected_at is None else now - self._suspected_at
        self._suspected_at = now
        if stalled > self.suspect_after / 2:
            return [], recovered
        suspected = [m for m in self.alive() if not m.suspect and now - m.last_seen > self.suspect_after]
        for m in suspected:
            m.suspect = True
        return suspected, recovered

    def needs_restart(self, current: dict) -> dict[str, list[str]]:
        """Members heard from (alive, leaving, drained) that took other values of ``current``'s settings when they
        registered: member -> the names that differ."""
        heard = (MemberStatus.ALIVE, MemberStatus.LEAVING, MemberStatus.DRAINED)
        out = {}
        for m in self.members.values():
            stale = sorted(k for k, v in current.items() if m.settings is not None and m.settings.get(k, v) != v)
            if stale and m.status in heard:
                out[m.node_id] = stale
        return out

    def checked_in_since(self, started: float) -> bool:
        """Every live member has been heard from since ``started`` (a restarted coordinator waits for it)."""
        return all(m.last_seen > started for m in self.alive())

    def leave(self, node_id: str, drain: bool = False) -> bool:
        """A graceful leave (``drain``: a drain) begins; False when nothing moves: a DRAINED node stopping (it holds
        nothing and stays DRAINED), or no other node is alive to take its partitions (a leaving one is DEAD then:
        they wait on its disk for its return; a drain is refused)."""
        member = self._known(node_id)
        if member.status is MemberStatus.DRAINED and not drain:
            member.stopped = True
            return False
        if drain and member.status is not MemberStatus.ALIVE:
            raise MembershipChangeError(f"node {node_id} is {member.shown}: only a live node can be drained")
        if not any(m.node_id != node_id for m in self.alive()):
            if drain:
                raise MembershipChangeError(f"node {node_id} is the only live node: no other node could take its partitions")
            member.status = MemberStatus.DEAD
            return False
        member.status, member.drain = MemberStatus.LEAVING, drain
        return True

    def left(self, node_id: str) -> None:
        member = self.members[node_id]
        member.status, member.drain = MemberStatus.DRAINED if member.drain else MemberStatus.LEFT, False

    def leave_failed(self, node_id: str) -> None:
        member = self.members[node_id]
        member.status, member.drain = MemberStatus.ALIVE if member.drain else MemberStatus.DEAD, False

    def undrain(self, node_id: str, now: float) -> None:
        """A DRAINED member heard within the timeout becomes a target of partitions again."""
        member = self._known(node_id)
        if member.status is not MemberStatus.DRAINED:
            raise MembershipChangeError(f"node {node_id} is {member.shown}, not drained")
        if now - member.last_seen > self.heartbeat_timeout:
            raise MembershipChangeError(f"node {node_id} is drained and silent for {now - member.last_seen:.0f} s: "
                                        "start its process, then undrain it")
        member.status = MemberStatus.ALIVE

    def remove(self, node_id: str, now: float, holds: list[int]) -> Member:
        """Forget a member that is gone and holds nothing (see the module's docstring); answers it."""
        member = self._known(node_id)
        if member.status in (MemberStatus.ALIVE, MemberStatus.LEAVING):
            raise MembershipChangeError(f"node {node_id} is {member.shown}: drain it first (rockstate drain {node_id}), "
                                        "stop its process, then remove it")
        if member.status is MemberStatus.DRAINED and not member.stopped and now - member.last_seen <= self.heartbeat_timeout:
            raise MembershipChangeError(f"node {node_id} is drained but its process still runs (heard "
                                        f"{now - member.last_seen:.1f} s ago): stop it first, or it would only come back")
        if holds:
            raise MembershipChangeError(
                f"node {node_id} is {member.shown} and still holds {len(holds)} partition(s) ({', '.join(map(str, holds[:8]))}"
                f"{', ...' if len(holds) > 8 else ''}) that no replica or checkpoint has taken over yet: removing it would "
                "lose them; bring it back, or wait for their promotion or restore", partitions=holds[:64])
        return self.members.pop(node_id)

    def _known(self, node_id: str) -> Member:
        member = self.members.get(node_id)
        if member is None:
            raise UnknownNodeError(f"the cluster has no node {node_id!r}; its nodes are {', '.join(sorted(self.members)) or 'none'}")
        return member
