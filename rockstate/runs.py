"""Keys in runs by partition: how a read or a batch put of many keys goes to a backend, as columns.

A backend's ``read_runs(state, pids, counts, keys)`` answers the values of ``keys`` taken as runs, run i
``counts[i]`` keys of partition ``pids[i]``, in one list. Columns rather than a list per partition: a 5,000-key
read at P=1024 reaches ~1,000 partitions, ~340 a node, and a list per partition on each side of the wire was
most of what the read cost beyond RocksDB's own. Its ``write_runs(op, state, pids, counts, keys, values)`` puts
(PUT_MANY, a value per key) or deletes (DELETE_MANY, values None) keys taken so: each run is the partition's
group ``[(op, state, keys, values)]`` (``ops.run_groups``), and a list per partition kept for the call made the
writer's garbage collector walk them.
"""

from __future__ import annotations

from itertools import chain
from typing import Callable, Sequence

import numpy as np

ReadRuns = Callable[[str, list, list, list], list]  # a backend's read_runs(state, pids, counts, keys)


def group_by_partition(pids: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
    """A stable order that groups rows by partition, and the (pid, start, end) of each group in it."""
    if len(pids) and pids.min() == pids.max():  # one partition: no sort needed
        return np.arange(len(pids)), [(int(pids[0]), 0, len(pids))]
    order = np.argsort(pids, kind="stable")
    return order, _groups(pids[order])


def _groups(ordered: np.ndarray) -> list[tuple[int, int, int]]:
    """The (pid, start, end) of each partition's rows in ``ordered`` (partitions in order)."""
    cuts = (np.flatnonzero(ordered[1:] != ordered[:-1]) + 1).tolist()
    starts, ends = [0, *cuts], [*cuts, len(ordered)]
    return [(int(ordered[a]), a, b) for a, b in zip(starts, ends)] if len(ordered) else []


SORTED_FROM = 8  # keys a partition on average, below which their order gains nothing


def write_order(pids: np.ndarray, keys: list[bytes]) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
    """``group_by_partition``, each partition's keys in the order of their first 16 bytes too (stable: a key twice
    keeps its last value): RocksDB inserts a key that follows the one before near it, and a node's share of a
    5,000-key batch of UUID keys cost its primary's and its backup's RocksDB writes 26 % less at P=16 (the nodes' CPU a
    key 16 % less; the order costs the client ~0.1 µs a key). Not for short runs: P=1024's ~5 keys a partition gained
    nothing."""
    if len(keys) < SORTED_FROM * np.count_nonzero(np.bincount(pids)):
        return group_by_partition(pids)
    heads = np.array(keys, dtype="S16").view(">u8").reshape(-1, 2)  # NUL-padded, as two big-endian numbers
    order = np.lexsort((heads[:, 1], heads[:, 0], pids))
    return order, _groups(pids[order])


def objects(items: Sequence) -> np.ndarray:
    """``items`` as a 1-d object array (``np.array`` would make a 2-d one of equal-length tuples)."""
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


def read_columns(read_runs: ReadRuns, state: str, keys: list[bytes], pids: np.ndarray) -> list[bytes | None]:
    """The values of ``keys`` (``pids[i]`` is ``keys[i]``'s partition), in their order, by one ``read_runs``."""
    if not keys:
        return []
    order, groups = group_by_partition(pids)
    if len(groups) == 1:  # one partition: the keys as they are
        return read_runs(state, [groups[0][0]], [len(keys)], keys)
    found = read_runs(state, [pid for pid, _, _ in groups], [b - a for _, a, b in groups], objects(keys)[order].tolist())
    out = np.empty(len(keys), dtype=object)
    out[order] = objects(found)
    return out.tolist()


def get_many_as_runs(read_runs: ReadRuns, state: str, keys_by_pid: dict[int, list[bytes]]) -> dict[int, list[bytes | None]]:
    """A backend's ``get_many`` ({pid: keys} -> {pid: values}) by one ``read_runs``."""
    runs = [(pid, keys) for pid, keys in keys_by_pid.items() if keys]
    found = read_runs(state, [pid for pid, _ in runs], [len(keys) for _, keys in runs],
                      list(chain.from_iterable(keys for _, keys in runs)))
    out: dict[int, list[bytes | None]] = {pid: [] for pid in keys_by_pid}
    at = 0
    for pid, keys in runs:
        out[pid] = found[at:at + len(keys)]
        at += len(keys)
    return out
