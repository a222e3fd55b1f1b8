"""Writes that reach many partitions at once: their locks taken in one order (``holding``), and a backup's batches
of many partitions gathered into one RocksDB WriteBatch (``ReplicatedWrites``)."""

from __future__ import annotations

import operator
from contextlib import contextmanager
from itertools import chain, repeat
from typing import Any, Callable, Iterable, Iterator

from rocksdict import WriteBatch

from ..errors import ProtocolError
from .keygroups import NodeDB
from .partition import REPLICATION, SEQ, SEQ_KEY, Partition
from .requests import REQUESTS, WRITTEN
from .writes import each


class ReplicatedWrites:
    """A backup's batches of several partitions gathered into one RocksDB WriteBatch (their locks held by the
    caller until ``flush``); at most one batch per partition between two flushes."""

    def __init__(self, db: NodeDB) -> None:
        self._db = db
        self._batch: WriteBatch | None = None  # made by the first add: a message of probes writes nothing
        self._done: dict[int, tuple[Partition, int, Callable[[int], None]]] = {}  # pid -> (its copy, its batch, then)
        self._puts: tuple[list, list, list] = ([], [], [])  # batches of puts only: their keys, values, handles

    def __contains__(self, pid: int) -> bool:
        return pid in self._done

    def holds_any(self, pids: Iterable[int]) -> bool:
        return not self._done.keys().isdisjoint(pids)

    def add(self, part: Partition, seq: int, stored: list, then: Callable[[int], None]) -> None:
        part.check_open()
        if self._batch is None:
            self._batch = WriteBatch(raw_mode=True)
        if not part.stage_replicated_puts(seq, stored, *self._puts):
            part.stage_replicated(seq, stored, self._batch)
        self._done[part.pid] = (part, seq, then)

    def add_puts(self, parts: list[Partition], seqs: list[int], thens: list[Callable[[int], None]], handle: Any,
                 counts: list[int], keys: list, values: list, request: bytes | None) -> None:
        """A run of batch puts' pieces (``ReplicaApply.runs``): partition ``parts[i]``'s batch ``seqs[i]`` put
        ``counts[i]`` of ``keys`` and ``values``, in order, into the state of ``handle``, with ``request``'s id;
        staged in C loops for all of them. A key that is not bytes stages none of them."""
        for part in parts:
            part.check_open()
        if self._batch is None:
            self._batch = WriteBatch(raw_mode=True)
        prefixes = [part.prefix for part in parts]
        staged_keys, staged_values, handles = self._puts
        # operator.add, not bytes.__add__ (whose slot wrapper made this 1.5x slower); TypeError: a key not bytes
        staged_keys += map(operator.add, chain.from_iterable(map(repeat, prefixes, counts)), keys)
        staged_values += values
        handles += repeat(handle, len(keys))
        kinds = parts[0].state_kind
        if request is not None:
            staged_keys += [prefix + request for prefix in prefixes]
            staged_values += repeat(WRITTEN, len(parts))
            handles += repeat(kinds(REQUESTS)[0], len(parts))
        staged_keys += [prefix + SEQ_KEY for prefix in prefixes]
        staged_values += map(SEQ.pack, seqs)
        handles += repeat(kinds(REPLICATION)[0], len(parts))
        self._done.update(zip([part.pid for part in parts], zip(parts, seqs, thens)))

    def flush(self) -> None:
        if not self._done or self._batch is None:
            return
        keys, values, handles = self._puts
        if keys:
            try:
                each(self._batch.put, keys, values, handles)
            except (TypeError, ValueError) as e:  # a value that is not bytes: nothing of the batch is written
                raise ProtocolError(f"a replicated batch holds a value that is not bytes: {e}") from None
        self._db.db.write(self._batch)
        for part, seq, then in self._done.values():
            part.applied(seq)
            then(seq)
        self._batch, self._done, self._puts = None, {}, ([], [], [])


@contextmanager
def holding(locks: Iterable[Any]) -> Iterator[None]:
    """Every lock of ``locks``, taken in their order and released in reverse (an ExitStack, with its wrapper per
    lock, was 5 % of the nodes' CPU under batch puts at P=1024)."""
    taken = []
    try:
        for lock in locks:
            lock.acquire()
            taken.append(lock)
        yield
    finally:
        for lock in reversed(taken):
            lock.release()
