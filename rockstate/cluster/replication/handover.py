"""The coordinator's side of a replicated partition's move: ``control/migration.py``'s ``Handover``, carried out.

The target joins as an extra backup and catches up (``in_sync.py``'s
catch-up, a copy and the stream), with another one when the old
primary's departure would leave too few; once the coordinator counts them
in sync, the source drains (``Drain``: writes wait, and it answers once its
backups applied everything), the target's position is checked against the
source's, the source lets go, and the target is promoted with a replica
epoch bump that every replica and client follows. Writes wait only from the
drain to the new table.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable

from ...control.in_sync import Action, CatchUp, InSyncSets
from ...control.migration import Handover, HandoverStep as Step
from ...errors import ClusterError, RockstateError
from ...rpc.async_client import AsyncChannel
from .. import protocol as p

log = logging.getLogger(__name__)

POLL = 0.1  # seconds between looks at the in-sync set while the target catches up


async def run_handover(h: Handover, sets: InSyncSets, *, carry_out: Callable[[list[Action]], Awaitable[None]],
                       catch_up: Callable[[CatchUp], Awaitable[int | None]], channel: Callable[[str], AsyncChannel],
                       event: Callable[..., None]) -> None:
    """Carry out ``h`` on the partition's replica ``sets``: ``carry_out(actions)`` and ``catch_up(a)`` as the replica
    control does them, ``channel(node)`` a connection to a member, ``event(name, **data)`` records what happened."""
    pid = h.partition
    where = {"partition": pid, "source": h.source, "target": h.target}
    src, dst = channel(h.source), channel(h.target)

    async def add() -> int:
        sets.reserve(pid, {h.target, *h.adds})  # not dropped by the replica planner while this runs
        actions = [a for node in h.adds for a in sets.add_backup(pid, node)]
        if len(actions) != 2 * len(h.adds):  # a Publish and a CatchUp each
            raise ClusterError(f"{list(h.adds)} cannot all be added as backups of partition {pid}")
        await carry_out([a for a in actions if not isinstance(a, CatchUp)])
        copied = await asyncio.gather(*(catch_up(a) for a in actions if isinstance(a, CatchUp)))
        return sum(n or 0 for n in copied)

    async def caught_up() -> None:
        while True:
            s = sets[pid]
            if s.primary != h.source or not {h.target, *h.adds} <= set(s.backups):
                raise ClusterError(f"partition {pid} changed while {[h.target, *h.adds]} caught up "
                                   f"(primary {s.primary}, backups {s.backups})")
            if {h.target, *h.adds} <= s.in_sync:
                return
            if h.waited(time.monotonic()) is Step.FAILED:
                raise ClusterError(f"{[h.target, *h.adds]} did not catch up with partition {pid} within {h.catch_up_timeout:g}s")
            await asyncio.sleep(POLL)

    async def confirm() -> int | None:
        answer = await dst.call(p.ReplicaPositions(partitions=[pid]))
        return answer.get(pid, answer.get(str(pid)))

    async def promote() -> None:
        actions = sets.promote(pid, h.target, h.source)
        if not actions:
            raise ClusterError(f"partition {pid} could not be handed to {h.target}: it changed meanwhile")
        await carry_out(actions)

    requests: dict[Step, Callable[[], Awaitable]] = {
        Step.ADD: add,
        Step.CATCH_UP: caught_up,
        Step.DRAIN: lambda: src.call(p.Drain(partition=pid), timeout=120.0),
        Step.CONFIRM: confirm,
        Step.RELEASE: lambda: src.call(p.Release(partition=pid)),  # no two nodes serve it at once
        Step.PROMOTE: promote,
        Step.UNFREEZE: lambda: src.call(p.Freeze(partition=pid, frozen=False)),
    }
    event("migration_started", **where)
    step, reason = h.start(time.monotonic()), None
    try:
        while step not in (Step.DONE, Step.FAILED):
            try:
                step = h.done(time.monotonic(), await requests[step]())
            except (RockstateError, OSError) as e:
                log.warning("handover of partition %d from %s to %s failed at %s: %s", pid, h.source, h.target, step, e)
                reason = reason or f"{step}: {e}"
                step = h.failed(time.monotonic())
    finally:
        sets.release(pid)
    if step is Step.FAILED:
        reason = reason or "the target lacked batches the source wrote; it stays a backup"
        event("migration_failed", **where, reason=reason)
        raise ClusterError(f"partition {pid} was not handed from {h.source} to {h.target}: {reason}")
    event("migration_finished", **where, **h.report())
