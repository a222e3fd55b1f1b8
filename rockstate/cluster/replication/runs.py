"""Runs: the pieces of batch puts, as a primary sends them to a backup (``ReplicaApply.runs``).

A batch put reaches a node as one piece per partition (at P=1024 a 5,000-key batch is ~340 pieces of ~5 keys a
node), and each piece is its partition's own batch: its sequence number, its request id, its place in the
partition's log and in the backup's tail. As items, each piece was a list of lists on the wire, checked, decoded
and applied one by one. A run carries the pieces of one request (one state, one request id) as columns: their
partitions, epochs, sequence numbers and key counts, and all their keys and values in two flat lists. The backup
checks each piece's position as it checks an item's, stages the run's entries in C loops
(``ReplicatedWrites.add_puts``) and keeps each piece in its partition's tail as the item it stands for
(``stored_piece``), so a promoted backup resends exactly what it would have.

A partition's batches in one message go all as items or all in runs, in runs that follow each other: the backup
applies the items first, then the runs in order.
"""

from __future__ import annotations

from itertools import chain
from typing import Iterable

from ...ops import RAW_PUT, RAW_PUT_MANY
from ...store.requests import REQUESTS, WRITTEN


def run_key(stored: list) -> tuple[str, bytes | None] | None:
    """A batch put's piece (RAW_PUT_MANY of one state, and its request id's RAW_PUT): its state and request id, the
    run it rides in; None for any other batch."""
    first = stored[0]
    if first[0] != RAW_PUT_MANY or type(first[2]) is not list or type(first[3]) is not list:
        return None
    if len(stored) == 1:
        return first[1], None
    if len(stored) == 2 and stored[1][0] == RAW_PUT and stored[1][1] == REQUESTS and stored[1][3] == WRITTEN:
        return first[1], stored[1][2]
    return None


class Runs:
    """``outgoing``'s runs, made from the logs' batch puts: a partition's batches go as items, or all in runs, each
    in a later run than the one before (the backup applies items first, then runs in order)."""

    def __init__(self) -> None:
        self.runs: dict[tuple[str, bytes | None], list] = {}  # (state, request) -> its pieces: (pid, epoch, seq, keys, values)

    def add(self, pid: int, epoch: int, entries: list) -> bool:
        """``pid``'s batches, when each is a batch put's and their runs follow each other; False: none taken."""
        if len(entries) == 1:  # the steady stream's case
            seq, stored, _ = entries[0]
            key = run_key(stored)
            if key is None:
                return False
            run = self.runs.get(key)
            if run is None:
                run = self.runs[key] = []
            run.append((pid, epoch, seq, stored[0][2], stored[0][3]))
            return True
        keys = [key for key in (run_key(stored) for _, stored, _ in entries) if key is not None]
        if len(keys) < len(entries):
            return False
        order = {k: i for i, k in enumerate(self.runs)}
        at = [order.setdefault(k, len(order)) for k in keys]  # the run each would ride in, in the message's order
        if any(b <= a for a, b in zip(at, at[1:])):  # one run twice (a request writing the partition twice), or back
            return False
        for key, (seq, stored, _) in zip(keys, entries):
            self.runs.setdefault(key, []).append((pid, epoch, seq, stored[0][2], stored[0][3]))
        return True

    def wire(self) -> list:
        """As ``ReplicaApply.runs`` has them: [state, request, pids, epochs, seqs, counts, keys, values] each."""
        runs = []
        for (state, request), pieces in self.runs.items():
            pids, epochs, seqs, keys, values = map(list, zip(*pieces))
            runs.append([state, request, pids, epochs, seqs, list(map(len, keys)), list(chain.from_iterable(keys)),
                         list(chain.from_iterable(values))])
        return runs


def stored_piece(state: str, request: bytes | None, keys: list, values: list) -> list:
    """The batch a run's piece stands for, as a primary stores and ships it."""
    puts = [RAW_PUT_MANY, state, keys, values]
    return [puts] if request is None else [puts, [RAW_PUT, REQUESTS, request, WRITTEN]]


def stored_pieces(state: str, request: bytes | None, keys: Iterable[list], values: Iterable[list]) -> list[list]:
    """``stored_piece`` of each of a run's pieces (``keys`` and ``values`` a list each), in one comprehension."""
    if request is None:
        return [[[RAW_PUT_MANY, state, k, v]] for k, v in zip(keys, values)]
    return [[[RAW_PUT_MANY, state, k, v], [RAW_PUT, REQUESTS, request, WRITTEN]] for k, v in zip(keys, values)]
