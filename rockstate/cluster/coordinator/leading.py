"""The part of ``Coordinator`` that follows its role: it leads only while ``control/leadership.py`` says so.

ZooKeeper's news comes from ``election.py`` on the event loop. Elected (or
reconnected while still holding the lock): load the documents, take them up
open the checkpoint storage, and only then lead and begin (``Coordinator._begin``: monitor,
resumption, periodic checkpoints).
Deposed or suspended: stop every task at once. While it does not lead, every
request is answered ``NotLeaderError`` naming the leader, which members and
clients follow (``leader.py``).
"""

from __future__ import annotations

import asyncio
import functools
import logging

log = logging.getLogger(__name__)


class Leading:
    """A part of ``Coordinator`` (it has ``role``, ``election``, ``persistence``, ``_tasks``, ``_load``, ``_prepare``,
    ``_begin``)."""

    def elected(self) -> None:
        self._turn(self.role.elected())

    def reconnected(self) -> None:
        self._turn(self.role.reconnected())

    def deposed(self) -> None:
        self._stop_acting(self.role.deposed(), "deposed")

    def suspended(self) -> None:
        self._stop_acting(self.role.suspended(), "out of touch with ZooKeeper")

    def _turn(self, turn: int | None) -> None:
        if turn is not None:
            self._spawn(self._lead(turn))

    async def _lead(self, turn: int) -> None:
        try:
            saved = await asyncio.to_thread(self.persistence.load)
        except Exception as e:  # give the lead up rather than hold the lock without leading
            log.warning("coordinator %s could not load the control plane's documents (%s): it resigns", self.address, e)
            self.election.resign()
            return
        if turn != self.role.turn:  # a later turn loads its own
            return
        self._load(saved)  # a standby's requests are refused, so taking the record up early is unseen
        await self._prepare()
        if not self.role.loaded(turn):  # deposed meanwhile
            return
        self._begin()
        self.event("coordinator_elected", coordinator=self.address, epoch=self.table.epoch)

    def _stop_acting(self, acting: bool, why: str) -> None:
        if acting:
            log.warning("coordinator %s stops leading: %s", self.address, why)
            for task in list(self._tasks):
                task.cancel()

    def leader_only(self, handlers: dict) -> dict:
        """Each handler, answering ``NotLeaderError`` (naming the leader) while this coordinator does not lead."""
        def gated(handler):
            @functools.wraps(handler)
            async def leader_only(msg, conn):
                if not self.role.leading:
                    raise await self.election.not_leader(self.address)
                return await handler(msg, conn)
            return leader_only

        return {cls: gated(handler) for cls, handler in handlers.items()}

    async def coordinators(self) -> dict:
        """The leader and the standbys (a single coordinator leads alone)."""
        if self.election is None:
            return {"leader": self.address, "standbys": []}
        return await self.election.coordinators()
