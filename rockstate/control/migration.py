"""One partition's move from its owner (the source) to another node (the target), as the coordinator runs it.

Steps (each one request to a node; ``cluster/moves.py`` says what the nodes do)::

    live (the default):   PULL ──▶ FREEZE ──▶ DELTA ──▶ RELEASE ──▶ COMMIT ──▶ DONE
    live_migration=False: FREEZE ──▶ PULL ──▶ DELTA ──▶ RELEASE ──▶ COMMIT ──▶ DONE
    no serving source:    COMMIT ──▶ DONE   (unassigned, or its node is gone: nothing to copy)

- PULL, on the target: fetch a copy while the source serves and records
  writes, open it, catch up.
- FREEZE, on the source: writes wait from now on.
- DELTA, on the target: apply the writes recorded since the catch-up.
- RELEASE, on the source: stop serving before the table changes, so no two
  nodes ever serve the partition at once. A failed release does not stop
  the move: the source learns of the new table by its next heartbeat, and
  its lease ends its serving before anyone could read a stale copy.
- COMMIT: the caller sets the new owner in the table (a new epoch) and
  sends it to every node.

``done(now)`` reports the step's success and answers the next step;
``failed(now)`` a failure: before RELEASE it answers ROLLBACK (unfreeze the
source, which discards its copy and recording, and make the target discard
what it fetched), then FAILED. A move interrupted by a coordinator crash
never changed the table (COMMIT is last), so its source still owns the
partition: the restarted coordinator rolls every move back at once (``Thaw``).
"""

from __future__ import annotations

from enum import StrEnum


class Step(StrEnum):
    PULL = "pull"
    FREEZE = "freeze"
    DELTA = "delta"
    RELEASE = "release"
    COMMIT = "commit"
    DONE = "done"
    ROLLBACK = "rollback"
    FAILED = "failed"


LIVE = (Step.PULL, Step.FREEZE, Step.DELTA, Step.RELEASE, Step.COMMIT, Step.DONE)
FROZEN_COPY = (Step.FREEZE, Step.PULL, Step.DELTA, Step.RELEASE, Step.COMMIT, Step.DONE)
NOTHING_TO_COPY = (Step.COMMIT, Step.DONE)


class Migration:
    def __init__(self, partition: int, source: str | None, target: str, *, source_serving: bool, live: bool = True) -> None:
        self.partition, self.source, self.target, self.live = partition, source, target, live
        self.copies = source_serving
        self._steps = (LIVE if live else FROZEN_COPY) if source_serving else NOTHING_TO_COPY
        self.step = self._steps[0]
        self.started = self.frozen = self.finished = 0.0
        self.copied_bytes = self.delta_ops = 0

    def start(self, now: float) -> Step:
        self.started = now
        return self.step

    def done(self, now: float, result: object = None) -> Step:
        """The current step succeeded (``result``: bytes copied after PULL, ops applied after DELTA)."""
        if self.step is Step.PULL:
            self.copied_bytes = result  # type: ignore[assignment]
        elif self.step is Step.DELTA:
            self.delta_ops = result  # type: ignore[assignment]
        elif self.step is Step.FREEZE:
            self.frozen = now
        elif self.step is Step.COMMIT:
            self.finished = now
        elif self.step is Step.ROLLBACK:
            self.step = Step.FAILED
            return self.step
        self.step = self._steps[self._steps.index(self.step) + 1]
        return self.step

    def failed(self, now: float) -> Step:
        """The current step failed: roll back, or (the release) go on to commit."""
        if self.step is Step.RELEASE:
            return self.done(now)
        if self.step in (Step.PULL, Step.FREEZE, Step.DELTA):
            self.step = Step.ROLLBACK
        else:
            self.step = Step.FAILED
        return self.step

    def report(self) -> dict:
        """The ``migration_finished`` event's numbers."""
        return {"bytes": self.copied_bytes, "delta_ops": self.delta_ops, "seconds": round(self.finished - self.started, 4),
                "write_blocked_seconds": round(self.finished - (self.frozen if self.live else self.started), 4)}
