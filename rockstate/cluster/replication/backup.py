"""A backup's side of a replicated partition: applying its primary's batches in order, and saying where it is.

``Backups`` owns the backup copies this node holds and their tails (of a partition
with another backup: a sole backup, promoted, has no replica behind it); it serves
``ReplicaApply`` and ``ReplicaPositions``. What each batch may do is decided by
``control/write_acks.BackupApply`` (older replica epochs refused as ``stale``,
gaps answered with the backup's position, a resend skipped). A new or returning
backup gets its copy from ``copies.py``, which hands it over with ``adopt``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from itertools import accumulate, chain
from typing import Callable, Iterable

from ...control.write_acks import BackupApply
from ...errors import ProtocolError, ReplicaBehindError, RockstateError, StaleEpochError
from ...store import Store
from ...store.many import ReplicatedWrites, holding
from ...store.requests import WRITTEN
from ...store.writes import put_pieces_bytes, stored_bytes
from .. import protocol as p
from .outcomes import Applied
from .runs import stored_piece, stored_pieces

TAIL = 64  # batches every replica keeps past what its backups applied: a promoted one resends its tail from them
# (a partition's only backup keeps none: ``Backups.configure``)
INLINE_ITEMS = 64  # a backup applies up to this many items (batches in any form) on its loop, more in a thread,
INLINE_KEYS = 8192  # and batch puts' pieces (runs) of up to this many keys, whatever their number: at P=1024 a
# 5,000-key batch sends each backup ~340 pieces of ~5 keys; their thread hop was 4-7 % of the nodes' CPU
Kept = tuple[int, list, int]  # a batch a replica keeps: (seq, stored ops, ``stored_bytes``)


class Backups:
    def __init__(self, store_of: Callable[[], Store], kept_bytes: int | None = None) -> None:
        """``kept_bytes``: what the tails may weigh in all (``stored_bytes``; None: TAIL batches each, whatever
        they weigh), shared evenly by the copies held."""
        self._store_of, self._kept_bytes = store_of, kept_bytes
        self._applies: dict[int, BackupApply] = {}  # partitions this node holds a caught-up backup copy of
        self._tails: dict[int, deque[Kept]] = {}  # pid -> its last batches, at most TAIL
        self._tail_bytes: dict[int, int] = {}
        self._sole: set[int] = set()  # partitions this node is the only backup of: no tail kept

    def holds(self, pid: int) -> bool:
        """Whether this node holds a backup copy of ``pid`` (it may serve stale reads from it)."""
        return pid in self._applies

    def adopt(self, pid: int, epoch: int, seq: int) -> None:
        """A copy of ``pid`` at batch ``seq`` is open here (``copies.py``): apply its primary's batches from ``seq + 1``."""
        self._applies[pid] = BackupApply(epoch, seq)

    def configure(self, pid: int, epoch: int, sole: bool = False) -> None:
        """The table's row of a partition this node backs (or is about to): a newer replica epoch, for a copy held
        here; ``sole``: this node is its only backup, and keeps no tail. Promoted, a sole backup has no other replica
        behind it: its old primary holds every batch it does (a drained one) or more (a copy of another history), and
        a new backup gets a copy. Were one behind after all, the tail lacking its batches gives it a copy too.
        Keeping each piece of a batch put in a tail was 8 % of the nodes' CPU under P=1024 puts."""
        if sole:
            self._sole.add(pid)
            self._tails.pop(pid, None)
            self._tail_bytes.pop(pid, None)
        else:
            self._sole.discard(pid)
        if pid in self._applies:
            self._applies[pid].configure(epoch)

    def forget(self, pid: int) -> bool:
        """Stop applying to ``pid``'s copy (dropped, or replaced by a new one); whether one was held."""
        self._tails.pop(pid, None)
        self._tail_bytes.pop(pid, None)
        return self._applies.pop(pid, None) is not None

    def promoted(self, pid: int, seq: int) -> list[Kept]:
        """This node is ``pid``'s primary now, its copy at batch ``seq``: the copy's tail through ``seq`` (none if it
        held no backup copy: a copy moved or restored in has another node's history)."""
        tail = self._tails.pop(pid, ())
        self._tail_bytes.pop(pid, None)
        return [e for e in tail if e[0] <= seq] if self._applies.pop(pid, None) else []

    def _keep(self, pid: int, seq: int, stored: list) -> None:
        """A batch applied, into the partition's tail (``_keep_all``)."""
        if pid not in self._sole:
            self._keep_all([pid], [seq], [stored], [stored_bytes(stored)])

    def _keep_all(self, pids: list[int], seqs: list[int], stored: Iterable[list], sizes: list[int]) -> None:
        """Batches applied (partition ``pids[i]``'s batch ``seqs[i]``), into their partitions' tails: at most TAIL +
        TAIL/2 batches each, and at most its share of ``kept_bytes`` but the newest (a promoted copy lacking one a backup
        needs gives that backup a copy). One pass for a run's pieces: a call per piece was 4 % of a backup's CPU at P=1024."""
        tails, weights, most = self._tails, self._tail_bytes, TAIL + TAIL // 2
        share = self._kept_bytes // max(1, len(self._applies)) if self._kept_bytes is not None else 1 << 62
        half = share // 2
        for pid, seq, batch, size in zip(pids, seqs, stored, sizes):
            tail = tails.get(pid)
            if tail is None:
                tail = tails[pid] = deque()
            tail.append((seq, batch, size))
            weight = weights.get(pid, 0) + size
            if len(tail) > most or weight > share:  # trimmed down to TAIL and half the share: not a batch at each
                while len(tail) > TAIL or (weight > half and len(tail) > 1):
                    weight -= tail.popleft()[2]
            weights[pid] = weight

    def kept(self) -> int:
        """What the tails weigh (``stored_bytes``)."""
        return sum(self._tail_bytes.values())

    # -- handlers ---------------------------------------------------------------------

    async def apply(self, msg: p.ReplicaApply, conn: object) -> list:
        runs = msg.runs or []
        if len(msg.items) <= INLINE_ITEMS and sum(len(run[6]) for run in runs) <= INLINE_KEYS:  # the steady stream: a thread hop would cost more than the writes
            return self._apply(msg.items, runs)
        return await asyncio.to_thread(self._apply, msg.items, runs)  # off the loop: a catching-up backup gets thousands

    def _apply(self, items: list, runs: list = []) -> list:
        """The items in order, then the runs, every partition's batches in one RocksDB WriteBatch (a partition's next
        batch in the same message writes what came before first: an append reads what its previous batch left)."""
        store = self._store_of()
        status: dict[int, Applied] = {}
        parts = {}
        in_runs = set().union(*(run[2] for run in runs))
        for pid in sorted(in_runs.union(item[0] for item in items).intersection(self._applies)):
            try:
                parts[pid] = store.partition(pid)
            except RockstateError:  # its copy closed meanwhile (dropped, replaced)
                status[pid] = Applied.NOT_READY
        written = sorted(in_runs.union(item[0] for item in items if item[3] is not None).intersection(parts))  # a probe takes no lock
        with holding(parts[pid].lock for pid in written):  # in partition order, as a write's: never two waiting for each other
            writes = ReplicatedWrites(store.db)
            for item in items:
                self._apply_item(item, parts, status, writes)
            for run in runs:
                self._apply_run(run, parts, status, writes, store.db.kinds)
            writes.flush()
        return [[pid, self._applies[pid].last_applied if pid in self._applies else 0, st] for pid, st in status.items()]

    def _apply_item(self, item: list, parts: dict, status: dict[int, Applied], writes: ReplicatedWrites) -> None:
        pid, epoch, seq, stored = item
        backup = self._applies.get(pid)
        if backup is None:
            status[pid] = Applied.NOT_READY
            return
        if status.get(pid, Applied.OK) != Applied.OK or stored is None:  # None: the primary asks where it is
            status.setdefault(pid, Applied.OK)
            return
        if pid in writes:
            writes.flush()
        try:
            if backup.check(epoch, seq):
                writes.add(parts[pid], seq, stored, backup.applied)
                self._keep(pid, seq, stored)
            status[pid] = Applied.OK
        except StaleEpochError:
            status[pid] = Applied.STALE
        except ReplicaBehindError:
            status[pid] = Applied.BEHIND
        except RockstateError:  # its copy closed meanwhile (dropped, replaced)
            status[pid] = Applied.NOT_READY
        except (KeyError, TypeError, ValueError) as e:  # an item of a key or value list that is not bytes
            raise ProtocolError(f"partition {pid}'s batch {seq} in a 'replica_apply' message: {e}") from None

    def _apply_run(self, run: list, parts: dict, status: dict[int, Applied], writes: ReplicatedWrites, kinds: dict) -> None:
        """A run of batch puts' pieces (``ReplicaApply.runs``): each piece checked as an item is, those to apply
        staged together (``ReplicatedWrites.add_puts``), and kept in their partitions' tails as the items they stand for."""
        state, request, pids, epochs, seqs, counts, keys, values = run
        offsets = list(accumulate(counts, initial=0))

        def piece(i: int) -> list:  # what ``items`` would carry of piece i
            return stored_piece(state, request, keys[offsets[i]:offsets[i + 1]], values[offsets[i]:offsets[i + 1]])

        if state not in kinds:  # a state not yet known here: the item path defines it
            for i, pid in enumerate(pids):
                self._apply_item([pid, epochs[i], seqs[i], piece(i)], parts, status, writes)
            return
        if writes.holds_any(pids):
            writes.flush()  # a batch of theirs before this one in the message: written first
        taken: list[int] = []
        applies, ok = self._applies, Applied.OK  # an enum's member looked up once, not per piece
        for i, pid in enumerate(pids):
            backup = applies.get(pid)
            if backup is None:
                status[pid] = Applied.NOT_READY
                continue
            if status.get(pid, ok) != ok:
                continue
            try:
                if backup.check(epochs[i], seqs[i]):
                    taken.append(i)
                status[pid] = ok
            except StaleEpochError:
                status[pid] = Applied.STALE
            except ReplicaBehindError:
                status[pid] = Applied.BEHIND
        if not taken:
            return
        taken_keys, taken_values = keys, values
        if len(taken) < len(pids):  # some applied before, or refused: the others' keys only
            taken_keys = list(chain.from_iterable(keys[offsets[i]:offsets[i + 1]] for i in taken))
            taken_values = list(chain.from_iterable(values[offsets[i]:offsets[i + 1]] for i in taken))
        taken_pids = [pids[i] for i in taken]
        try:
            writes.add_puts([parts[pid] for pid in taken_pids], [seqs[i] for i in taken],
                            [self._applies[pid].applied for pid in taken_pids], kinds[state][0],
                            [counts[i] for i in taken], taken_keys, taken_values, request)
        except RockstateError:  # a copy closed meanwhile (dropped, replaced), nothing staged: the pieces one by one
            for i in taken:
                self._apply_item([pids[i], epochs[i], seqs[i], piece(i)], parts, status, writes)
            return
        except TypeError as e:  # a key that is not bytes: the message fails whole, nothing of it written
            raise ProtocolError(f"a run of batches of partitions {taken_pids[:8]} in a 'replica_apply' message: {e}") from None
        sole = self._sole
        if sole.issuperset(taken_pids):  # the steady stream with one backup a partition: no tails
            return
        tailed = [i for i in taken if pids[i] not in sole] if sole else taken
        try:  # each kept as the item it stands for, weighed as ``stored_bytes`` would (its shape is known)
            sizes = put_pieces_bytes(counts, keys, values, request, WRITTEN)
        except TypeError:  # a value that is not bytes: the write fails it (the message whole)
            sizes = [0] * len(pids)
        if len(tailed) < len(pids):
            cuts = [slice(offsets[i], offsets[i + 1]) for i in tailed]
            seqs, sizes = [seqs[i] for i in tailed], [sizes[i] for i in tailed]
        else:
            cuts = list(map(slice, offsets, offsets[1:]))
        self._keep_all([pids[i] for i in tailed], seqs, stored_pieces(state, request, map(keys.__getitem__, cuts),
                                                                    map(values.__getitem__, cuts)), sizes)

    async def positions(self, msg: p.ReplicaPositions, conn: object) -> dict:
        return {pid: self._applies[pid].last_applied for pid in msg.partitions if pid in self._applies}
