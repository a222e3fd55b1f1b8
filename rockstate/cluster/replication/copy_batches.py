"""The coordinator's catch-ups, sent in batches: one ``ReplicaCatchUp`` per backup and primary carries every
partition waiting for a copy between them (up to ``BATCH``), so a start-up, a join or a failover pays one transfer
per pair of nodes rather than one per partition (a copy costs 0.1-1 s whatever its data: a snapshot,
a stream, an open). Each node takes part in at most ``limit`` transfers at once, as the backup or the primary;
what arrives while they run waits, and goes together. A cap per node, not per cluster: the pairs a leave or a
join involves grow with the nodes (at 16 nodes, a leave's 64 backups came from 64 pairs), and transfers between
other nodes do not load these.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from ...errors import RockstateError

log = logging.getLogger(__name__)

BATCH = 512  # partitions one transfer carries at most
LINGER = 0.05  # seconds a transfer waits for more partitions before it starts

Send = Callable[[str, str, dict[int, int]], Awaitable[dict]]


class CopyBatches:
    def __init__(self, send: Send, limit: int) -> None:
        """``send(node, primary, {pid: replica epoch})``: one ``ReplicaCatchUp``, answering {pid: bytes copied}."""
        self._send, self._limit_n = send, limit
        self._limits: dict[str, asyncio.Semaphore] = {}  # node -> its places
        self._waiting: dict[tuple[str, str], dict[int, tuple[int, asyncio.Future]]] = {}
        self._running: set[asyncio.Task] = set()  # held here: the loop keeps only a weak reference to a task

    async def copy(self, node: str, primary: str, pid: int, epoch: int) -> int | None:
        """``node`` copies ``pid`` from ``primary`` in the next transfer between them; answers the bytes (None: not copied)."""
        queue = self._waiting.setdefault((node, primary), {})
        if pid in queue:
            fut = queue[pid][1]
        else:
            fut = asyncio.get_running_loop().create_future()
            queue[pid] = (epoch, fut)
            if len(queue) == 1:  # the first waiting: a transfer will take it and whatever joins it meanwhile
                self._start(node, primary)
        return await asyncio.shield(fut)

    def _places(self, node: str) -> asyncio.Semaphore:
        places = self._limits.get(node)
        if places is None:
            places = self._limits[node] = asyncio.Semaphore(self._limit_n)
        return places

    def _start(self, node: str, primary: str) -> None:
        task = asyncio.ensure_future(self._run(node, primary))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _run(self, node: str, primary: str) -> None:
        # the catch-ups of one burst (a join's handovers, a table's new backups) join it; not holding a transfer's
        # place meanwhile (at 16 nodes, 240 pairs' transfers, 2 at a time, each lingering: a start-up 7 s -> 18 s)
        await asyncio.sleep(LINGER)
        first, second = sorted((node, primary))  # in one order: two transfers never hold a place each the other waits for
        async with self._places(first), self._places(second):
            queue = self._waiting.pop((node, primary), {})
            batch = dict(list(queue.items())[:BATCH])
            rest = {pid: w for pid, w in queue.items() if pid not in batch}
            if rest:  # the next transfer takes them
                self._waiting.setdefault((node, primary), {}).update(rest)
                self._start(node, primary)
            if not batch:
                return
            copied: dict[int, int] = {}
            try:
                answer = await self._send(node, primary, {pid: epoch for pid, (epoch, _) in batch.items()})
                copied = {int(pid): n for pid, n in answer.items() if type(n) is int}
            except (RockstateError, OSError, KeyError, ValueError, TypeError, AttributeError) as e:
                log.warning("backup %s could not copy %d partitions from %s: %s", node, len(batch), primary, e)
            finally:  # every catch-up waiting gets its answer, whatever happened
                for pid, (_, fut) in batch.items():
                    if not fut.done():
                        fut.set_result(copied.get(pid))
