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

A partition with backups moves by a ``Handover`` instead, so it never has
fewer in-sync replicas than configured (Kafka's reassignment, Hazelcast's
migration): the target is first an extra backup, then takes over::

    ADD ──▶ CATCH_UP ──▶ DRAIN ──▶ CONFIRM ──▶ RELEASE ──▶ PROMOTE ──▶ DONE
    (CATCH_UP first when nothing is to be added)
    a failure before DRAIN: FAILED; at DRAIN or CONFIRM: UNFREEZE ──▶ FAILED

- ADD: the target becomes an extra backup, not in sync, and catches up as
  any new backup does (a copy of the partition, then the primary's stream); so do
  the others ``replica_placement.handover_adds`` names, when without the old
  primary too few in-sync replicas would be left (its backup takes over).
- CATCH_UP: done once the coordinator counts them in sync (``waited`` answers
  FAILED after ``catch_up_timeout``).
- DRAIN, on the source: freeze the partition's writes (and its own sweeps)
  and answer its last batch once every in-sync backup applied it.
- CONFIRM: the target's position; below the drained source's last batch
  the handover fails (UNFREEZE: the source writes on), as it would lose writes.
- RELEASE, on the source: stop serving before the table changes; a failed
  release goes on, as a move's does.
- PROMOTE: the target is primary from the next replica epoch; the old
  primary leaves the replica set (its node retires its copy; a plan that
  keeps it as a backup adds it back, and it copies anew).
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


class HandoverStep(StrEnum):
    ADD = "add"
    CATCH_UP = "catch_up"
    DRAIN = "drain"
    CONFIRM = "confirm"
    RELEASE = "release"
    PROMOTE = "promote"
    DONE = "done"
    UNFREEZE = "unfreeze"
    FAILED = "failed"


HANDOVER = (HandoverStep.ADD, HandoverStep.CATCH_UP, HandoverStep.DRAIN, HandoverStep.CONFIRM, HandoverStep.RELEASE,
            HandoverStep.PROMOTE, HandoverStep.DONE)
CATCH_UP_TIMEOUT = 300.0  # seconds the target may take to be in sync


class Handover:
    """A replicated partition's primary moving from ``source`` to ``target`` without losing an in-sync replica."""

    copies = True

    def __init__(self, partition: int, source: str, target: str, adds: tuple[str, ...] = (),
                 catch_up_timeout: float = CATCH_UP_TIMEOUT) -> None:
        """``adds``: the replicas to add first (``replica_placement.handover_adds``)."""
        self.partition, self.source, self.target, self.catch_up_timeout = partition, source, target, catch_up_timeout
        self.adds = tuple(adds)
        self.step = HandoverStep.ADD if adds else HandoverStep.CATCH_UP
        self.started = self.caught_up = self.frozen = self.finished = 0.0
        self.copied_bytes = self.drained_seq = 0

    def start(self, now: float) -> HandoverStep:
        self.started = self.caught_up = now
        return self.step

    def done(self, now: float, result: object = None) -> HandoverStep:
        """The current step succeeded (``result``: bytes copied after ADD, the source's last batch after DRAIN,
        the target's position after CONFIRM)."""
        step = self.step
        if step is HandoverStep.UNFREEZE:
            self.step = HandoverStep.FAILED
            return self.step
        if step is HandoverStep.ADD:
            self.copied_bytes = result or 0  # type: ignore[assignment]
        elif step is HandoverStep.CATCH_UP:
            self.caught_up = now
        elif step is HandoverStep.DRAIN:
            self.frozen, self.drained_seq = now, result  # type: ignore[assignment]
        elif step is HandoverStep.CONFIRM and (result is None or result < self.drained_seq):  # type: ignore[operator]
            self.step = HandoverStep.UNFREEZE  # the target lacks batches the source wrote: it must not lead
            return self.step
        elif step is HandoverStep.PROMOTE:
            self.finished = now
        self.step = HANDOVER[HANDOVER.index(step) + 1]
        return self.step

    def waited(self, now: float) -> HandoverStep:
        """CATCH_UP is not done yet at ``now``: FAILED once it took longer than ``catch_up_timeout``."""
        if self.step is HandoverStep.CATCH_UP and now - self.started > self.catch_up_timeout:
            self.step = HandoverStep.FAILED
        return self.step

    def failed(self, now: float) -> HandoverStep:
        """The current step failed: undo the freeze, go on past a failed release, or give up."""
        if self.step is HandoverStep.RELEASE:
            return self.done(now)
        self.step = HandoverStep.UNFREEZE if self.step in (HandoverStep.DRAIN, HandoverStep.CONFIRM) else HandoverStep.FAILED
        return self.step

    def report(self) -> dict:
        """The ``migration_finished`` event's numbers (no delta: the target followed the stream)."""
        return {"bytes": self.copied_bytes, "delta_ops": 0, "seconds": round(self.finished - self.started, 4),
                "catch_up_seconds": round(self.caught_up - self.started, 4), "drained_batch": self.drained_seq,
                "write_blocked_seconds": round(self.finished - self.frozen, 4)}
