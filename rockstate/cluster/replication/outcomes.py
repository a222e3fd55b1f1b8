"""What the replication parts answer and report: a backup's answer per partition, a primary's reports of its backups.

Both are ``StrEnum``s: their wire value is the string the protocol always carried, so
neither side of a connection changes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from enum import StrEnum
from typing import Awaitable, Callable

from ...errors import RockstateError

log = logging.getLogger(__name__)


class Applied(StrEnum):
    """A backup's answer for one partition of a ``ReplicaApply``."""

    OK = "ok"
    STALE = "stale"  # an older replica epoch than the newest it knows: a deposed primary
    BEHIND = "behind"  # past a gap: the primary resends from the backup's position
    NOT_READY = "not_ready"  # no open copy (a restarted node, a copy closed meanwhile): only a new copy helps


class Report(StrEnum):
    """What a primary tells the coordinator of one of its backups (``ReplicaReport``)."""

    CAUGHT_UP = "caught_up"
    UNREACHABLE = "unreachable"
    DIVERGED = "diverged"  # its copy is not the primary's any more: only a new copy brings it back


class Reports:
    """A primary's reports to the coordinator, the same one at most once per replica timeout."""

    def __init__(self, send: Callable[[list], Awaitable[None]], epoch_of: Callable[[int], int],
                 timeout: Callable[[], float]) -> None:
        self._send, self._epoch_of, self._timeout = send, epoch_of, timeout
        self._last: dict[tuple[int, str, Report], float] = {}

    def report(self, pid: int, node: str, kind: Report) -> None:
        key, now = (pid, node, kind), time.monotonic()
        if now - self._last.get(key, -1e9) < self._timeout():
            return
        self._last[key] = now
        epoch = self._epoch_of(pid)
        log.debug("report %s %s of partition %d at epoch %d", node, kind, pid, epoch)
        asyncio.ensure_future(self._sent([[pid, node, epoch, kind]]))

    def again(self, pid: int, node: str, kind: Report) -> None:
        """Report it now, whenever it was last."""
        self._last.pop((pid, node, kind), None)
        self.report(pid, node, kind)

    async def _sent(self, reports: list) -> None:
        try:
            await self._send(reports)
        except RockstateError as e:
            log.warning("could not report %s to the coordinator: %s", reports, e)
