"""A backup's side of a replicated partition: applying its primary's batches in order, and saying where it is.

``BackupSide`` is the part of ``NodeReplication`` (replication.py, which has ``applies``, ``logs`` and
``store``) that serves ``ReplicaApply`` and ``ReplicaPositions``; what each batch may do is decided by
``control/write_acks.BackupApply`` (older replica epochs refused as ``stale``, gaps answered with the
backup's position, a resend skipped).
"""

from __future__ import annotations

import asyncio
from collections import deque

from ...errors import ReplicaBehindError, RockstateError, StaleEpochError
from .. import protocol as p

TAIL = 64  # batches every replica keeps past what its backups applied: a promoted one resends its tail from them
INLINE_ITEMS = 64  # a backup applies up to this many on its loop, more in a thread


class BackupSide:
    """A part of ``NodeReplication``: the backup copies this node holds (``applies``) and their tails (``logs``)."""

    async def apply(self, msg: p.ReplicaApply, conn) -> list:
        if len(msg.items) <= INLINE_ITEMS:  # the steady stream: a thread hop would cost more than the writes
            return self._apply(msg.items)
        return await asyncio.to_thread(self._apply, msg.items)  # off the loop: a catching-up backup gets thousands

    def _apply(self, items: list) -> list:
        answers: dict[int, list] = {}
        for pid, epoch, seq, stored in items:
            backup = self.applies.get(pid)
            if backup is None:
                answers[pid] = [pid, 0, "not_ready"]
                continue
            if answers.get(pid, [0, 0, "ok"])[2] != "ok":
                continue
            if stored is None:  # the primary asks where this copy is
                answers[pid] = [pid, backup.last_applied, "ok"]
                continue
            try:
                if backup.check(epoch, seq):
                    self.store.partition(pid).apply_replicated(seq, stored)
                    backup.applied(seq)
                    self.logs.setdefault(pid, deque(maxlen=TAIL)).append((seq, stored))
                status = "ok"
            except StaleEpochError:
                status = "stale"
            except ReplicaBehindError:
                status = "behind"
            except RockstateError:  # its copy closed meanwhile (dropped, replaced)
                status = "not_ready"
            answers[pid] = [pid, backup.last_applied, status]
        return list(answers.values())

    async def positions(self, msg: p.ReplicaPositions, conn) -> dict:
        return {pid: self.applies[pid].last_applied for pid in msg.partitions if pid in self.applies}

    def backup_copy(self, pid: int) -> bool:
        return pid in self.applies
