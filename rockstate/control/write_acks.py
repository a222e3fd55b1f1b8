"""When a replicated partition's write is acknowledged: the primary's side (``PrimaryAcks``) and the backup's (``BackupApply``).

Write batches carry a sequence number, one after the other in the
primary's order, and the partition's epoch; a backup applies them in that
order, so what it holds is always a prefix of the primary's batches, and
``applied(backup, seq)`` means every batch through ``seq``.

The primary (``replication: sync``, the default): a batch is acknowledged
once every member it waits for has applied it, at once when it waits for
none. It waits for the coordinator's in-sync set (``in_sync.InSyncSets``)
and for backups it reported caught up, so the coordinator's set never names
a member the primary does not wait for. ``replication: async`` acknowledges
every batch when it is sent; the backups follow (a primary's death may lose
what they had not applied).

- ``send(now)``: the next batch's ``Batch(seq, epoch, acknowledged)``; ``sent_through(seq, now)``: every
  batch through ``seq`` sent (the primary's, per write, without a ``Batch``).
- ``applied(backup, seq)``: answers the sequences this acknowledges, in order.
- ``configure(epoch, backups, in_sync)``: the coordinator's set at a newer
  epoch (older ones change nothing). Only this stops the primary waiting for
  a backup, so it never acknowledges without a member the coordinator still
  counts; answers the sequences acknowledged now.
- ``caught_up(backup, carried)``: whether to report the backup caught up.
  A backup that applied everything its last request carried (``carried``,
  the log's end when it was sent) is JOINING: waited for from now on, so no
  batch is acknowledged without it any more. Under steady writes it is never
  level with the last batch sent when its answer comes (batches are sent
  meanwhile): being one request behind is enough to join. A joining backup
  that holds every acknowledged batch is reported to the coordinator (at this
  epoch), and only then, so the coordinator never counts a backup that lacks
  an acknowledged write. The coordinator takes a report only at the epoch it
  was made, and its next epoch then counts the backup in sync; so a newer
  epoch that does not has refused the report, and the primary stops waiting
  for the backup (it reports again once it is caught up).
- ``overdue(now, max_lag)``: waited-for backups that have not applied a batch
  sent more than ``max_lag`` seconds ago: to report as behind. A joining one
  not yet reported is waited for no more (the coordinator does not count it);
  ``acked`` may move on.

The backup: ``check(epoch, seq)`` before applying a batch: True to apply it,
False when it holds it already (a resend); a batch of an epoch older than the
newest it knows raises ``StaleEpochError`` (a deposed primary), one past a
gap ``ReplicaBehindError``. ``applied(seq)`` once it is applied;
``configure(epoch)`` when the coordinator publishes a newer epoch.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import StrEnum
from typing import Iterable, Mapping

from ..errors import ReplicaBehindError, StaleEpochError


class Replication(StrEnum):
    SYNC = "sync"
    ASYNC = "async"


@dataclass(frozen=True)
class Batch:
    seq: int
    epoch: int
    acknowledged: bool  # already, when it is sent


class PrimaryAcks:
    def __init__(self, epoch: int, positions: Mapping[str, int], last_seq: int = 0,
                 replication: Replication | str = Replication.SYNC) -> None:
        """``positions``: each in-sync backup's last applied sequence; ``last_seq``: the primary's own."""
        self.epoch, self.replication = epoch, Replication(replication)
        self._async = self.replication is Replication.ASYNC
        self.in_sync = set(positions)
        self.joining: set[str] = set()  # waited for, not yet in a published in-sync set
        self.reported: set[str] = set()  # joining ones reported caught up to the coordinator
        self.position = dict(positions)
        self.last_sent = self.acked = last_seq
        self._sent: deque[tuple[int, float]] = deque()  # (seq, when it was sent), in order; not yet applied by all waited for

    def waits(self) -> set[str]:
        return self.in_sync | self.joining

    def send(self, now: float) -> Batch:
        self.sent_through(self.last_sent + 1, now)
        return Batch(self.last_sent, self.epoch, self.acked >= self.last_sent)

    def sent_through(self, seq: int, now: float) -> None:
        """``send`` of every batch through ``seq`` (the primary's hot path: no ``Batch`` made per write)."""
        if seq == self.last_sent + 1:  # one batch, as a write ships it
            self._sent.append((seq, now))
            self.last_sent = seq
        elif seq > self.last_sent:
            self._sent.extend((s, now) for s in range(self.last_sent + 1, seq + 1))
            self.last_sent = seq
        if self._async:
            self.acked = self.last_sent
        if not (self.in_sync or self.joining):
            self._advance()

    def applied(self, backup: str, seq: int) -> list[int]:
        position = self.position
        if backup in position and seq > position[backup]:  # a dropped backup's late answer: ignored
            position[backup] = seq if seq < self.last_sent else self.last_sent
        return self._advance()

    def configure(self, epoch: int, backups: Iterable[str], in_sync: Iterable[str]) -> list[int]:
        backups = set(backups)
        if epoch <= self.epoch:  # backups added or dropped without a new epoch (none of them in sync)
            self.position = {b: self.position.get(b, 0) for b in backups | self.in_sync}
            self.joining &= backups  # a dropped one is waited for no more
            self.reported &= backups
            return self._advance()
        self.epoch, self.in_sync = epoch, set(in_sync) & backups  # the primary itself is not waited for
        self.joining, self.reported = set(), set()  # in sync now, or the report was refused
        self.position = {b: self.position.get(b, 0) for b in backups}
        return self._advance()

    def caught_up(self, backup: str, carried: int | None = None) -> bool:
        position = self.position.get(backup)
        if position is None:
            return False
        if backup in self.in_sync:
            return position >= self.last_sent
        if backup not in self.joining and position >= (self.last_sent if carried is None else carried):
            self.joining.add(backup)
        if backup in self.joining and position >= self.acked:
            self.reported.add(backup)
            return True
        return False

    def overdue(self, now: float, max_lag: float) -> list[str]:
        sent = self._sent
        if not sent or now - sent[0][1] <= max_lag:  # the oldest batch some backup lacks is recent: none is late
            return []  # (a sender's look over all its partitions asks each, every 0.1 s while writes flow)
        late = []
        for backup in sorted(self.waits()):
            position = self.position[backup]
            oldest = next((at for seq, at in self._sent if seq > position), None)  # in order: the first found
            if oldest is not None and now - oldest > max_lag:
                late.append(backup)
                if backup in self.joining and backup not in self.reported:
                    self.joining.discard(backup)
                    self._advance()
        return late

    def _advance(self) -> list[int]:
        waits = self.in_sync | self.joining if self.joining else self.in_sync
        if len(waits) == 1:  # one backup (the default): its position; ``min`` over one was a third of a write's acks
            for backup in waits:
                through = self.position[backup]
        else:
            through = min(map(self.position.__getitem__, waits), default=self.last_sent)
        sent = self._sent
        while sent and sent[0][0] <= through:
            sent.popleft()
        if self._async or through <= self.acked:
            return []
        newly = list(range(self.acked + 1, through + 1))
        self.acked = through
        return newly


class BackupApply:
    def __init__(self, epoch: int, applied: int = 0) -> None:
        """``applied``: the last sequence this replica holds (a caught-up copy's, or 0)."""
        self.epoch, self.last_applied = epoch, applied

    def configure(self, epoch: int) -> None:
        self.epoch = max(self.epoch, epoch)

    def check(self, epoch: int, seq: int) -> bool:
        if epoch < self.epoch:
            raise StaleEpochError(
                f"a batch of epoch {epoch} from a primary that was replaced at epoch {self.epoch}; "
                "the partition's current primary is in the newest table", epoch=self.epoch)
        self.epoch = epoch
        if seq <= self.last_applied:
            return False
        if seq > self.last_applied + 1:
            raise ReplicaBehindError(
                f"batch {seq} arrived after batch {self.last_applied}; the backup catches up from the primary first",
                applied=self.last_applied)
        return True

    def applied(self, seq: int) -> None:
        self.last_applied = max(self.last_applied, seq)
