"""Whether a coordinator may answer and act: the leader among several, or the only one.

A coordinator with ZooKeeper stands by until it is elected, loads the
control plane's documents, and only then leads: answers members and clients
and runs its tasks (monitor, moves, failovers, periodic checkpoints). ::

    STANDING_BY ── elected() (holds the lock, connected) ──▶ LOADING ── loaded(turn) ──▶ LEADING
    LOADING / LEADING ── deposed() (the session ended, or a write was refused) ──▶ STANDING_BY
    LOADING / LEADING ── suspended() (lost touch with ZooKeeper) ──▶ STANDING_BY, still holding the lock
    STANDING_BY ── reconnected() while holding the lock ──▶ LOADING (a new turn: load again, resume)

A suspended leader stops at once, before ZooKeeper could let its session
expire and elect another: it renews no lease, so no node keeps serving on its
word after a successor could act (the successor waits a whole heartbeat
timeout first). ``elected``/``reconnected`` answer the turn to load (None:
nothing to do); ``loaded(turn)`` answers whether that turn still stands;
``deposed``/``suspended`` answer whether the coordinator was acting (its
tasks must stop). A single coordinator is LEADING from the start.
"""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    STANDING_BY = "standing_by"
    LOADING = "loading"
    LEADING = "leading"


class CoordinatorRole:
    def __init__(self, alone: bool) -> None:
        self.phase = Phase.LEADING if alone else Phase.STANDING_BY
        self.holds_lock = alone
        self.connected = True
        self.turn = 0

    @property
    def leading(self) -> bool:
        return self.phase is Phase.LEADING

    def _begin(self) -> int | None:
        if not (self.holds_lock and self.connected and self.phase is Phase.STANDING_BY):
            return None
        self.turn += 1
        self.phase = Phase.LOADING
        return self.turn

    def elected(self) -> int | None:
        self.holds_lock = True
        return self._begin()

    def reconnected(self) -> int | None:
        self.connected = True
        return self._begin()

    def loaded(self, turn: int) -> bool:
        if turn != self.turn or self.phase is not Phase.LOADING:
            return False
        self.phase = Phase.LEADING
        return True

    def _stop(self) -> bool:
        acting = self.phase is not Phase.STANDING_BY
        self.phase = Phase.STANDING_BY
        self.turn += 1  # a load in flight is void
        return acting

    def deposed(self) -> bool:
        self.holds_lock = False
        return self._stop()

    def suspended(self) -> bool:
        self.connected = False
        return self._stop()
