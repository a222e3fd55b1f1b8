"""The coordinator's side of a partition's move: ``control/migration.py``'s steps, carried out as requests.

The node's side (the handlers for each step) is ``node/migration.py``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable

from ...control.migration import Migration, Step
from ...errors import RockstateError
from ...rpc import AsyncChannel
from .. import protocol as p

log = logging.getLogger(__name__)


async def run_move(m: Migration, src: AsyncChannel | None, dst: AsyncChannel, source_address: str | None,
                   commit: Callable[[], Awaitable[None]], event: Callable[..., None]) -> None:
    """Carry out the move's steps with requests to its source and target, and ``commit`` (the new table)."""
    where = {"partition": m.partition, "source": m.source, "target": m.target}
    pid = m.partition

    def request(step: Step) -> Awaitable:
        if step is Step.COMMIT:
            return commit()
        assert src is not None and source_address is not None  # a move without a serving source only commits
        if step is Step.PULL:
            return dst.call(p.Pull(partition=pid, source=source_address), timeout=3600.0)
        if step is Step.FREEZE:
            return src.call(p.Freeze(partition=pid))
        if step is Step.DELTA:
            return dst.call(p.PullDelta(partition=pid, source=source_address), timeout=600.0)
        if step is Step.RELEASE:  # before the table changes: no two nodes ever serve the partition at once
            return src.call(p.Release(partition=pid))
        return asyncio.gather(src.call(p.Freeze(partition=pid, frozen=False)), src.call(p.MoveDiscard(partition=pid)),
                              dst.call(p.PullDiscard(partition=pid)), return_exceptions=True)

    if m.copies:
        event("migration_started", **where)
    step = m.start(time.monotonic())
    try:
        while step is not Step.DONE:
            try:
                result = await request(step)
            except RockstateError as e:
                if step is not Step.RELEASE:
                    raise
                # unreachable: it learns of the new table by its next heartbeat, and its lease ends before
                log.warning("could not make %s let go of partition %d: %s", m.source, pid, e)
                step = m.failed(time.monotonic())
                continue
            step = m.done(time.monotonic(), result)
    except BaseException:
        if m.failed(time.monotonic()) is Step.ROLLBACK:
            await request(Step.ROLLBACK)
            event("migration_failed", **where)
        raise
    if m.copies:
        event("migration_finished", **where, **m.report())
