"""The write ops: what every layer that writes speaks, from a state's put to a partition's WriteBatch.

An op is ``[code, state, key, value]``. ``states.py`` builds them, the
cluster client sends them in ``Write`` / ``Stage`` messages, a node checks
them (``store/checks.py``) and its store applies them. The codes are fixed: they
cross the wire.
"""

from __future__ import annotations

from typing import Sequence

# PUT_MANY and DELETE_MANY carry lists of keys (and values): one op per batch
# keeps the hot path and the wire compact. RAW_PUT stores the value as given
# (a TTL header included), DELETE_RANGE deletes keys in [key, value).
PUT, DELETE, APPEND, DELETE_PREFIX, PUT_MANY, DELETE_MANY, RAW_PUT, DELETE_RANGE = 0, 1, 2, 3, 4, 5, 6, 7
# Only in the replication stream (a primary's batches as stored, for its backups): clients may not send it.
RAW_PUT_MANY = 8
Op = Sequence  # (op, state, key, value)


def run_groups(op: int, state: str, pids: Sequence[int], counts: Sequence[int], keys: list,
               values: list | None) -> list[tuple[int, list]]:
    """Runs of keys (run i ``counts[i]`` keys of partition ``pids[i]``, ``values`` one per key or None) as the
    partitions' groups ``(pid, [(op, state, keys, values)])``, in run order: what a ``WriteRuns`` stands for."""
    groups, at = [], 0
    for pid, count in zip(pids, counts):
        groups.append((pid, [(op, state, keys[at:at + count], None if values is None else values[at:at + count])]))
        at += count
    return groups
