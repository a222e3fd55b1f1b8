"""The leading coordinator's background tasks (monitor, moves, failovers, catch-ups): started, logged, stopped together."""

from __future__ import annotations

import asyncio
import logging
from typing import Coroutine

from ...errors import RockstateError

log = logging.getLogger(__name__)


class Tasks:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task] = set()

    def spawn(self, coro: Coroutine) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        """A background task's end; a failure is said (the monitor redoes what is still due), a bug loudly."""
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        e, name = task.exception(), getattr(task.get_coro(), "__qualname__", task.get_name())
        if isinstance(e, (RockstateError, OSError)):
            log.warning("%s failed: %s", name, e)
        else:
            log.error("%s failed", name, exc_info=e)

    def cancel(self) -> None:
        """Stop every task now (the coordinator stops leading)."""
        for task in list(self._tasks):
            task.cancel()

    async def stop(self) -> None:
        self.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
