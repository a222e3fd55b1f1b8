"""A task's Arrow batches regrouped into sorted chunks of whole keys.

Spark cuts a task's input into Arrow batches of ``maxRecordsPerBatch`` rows
wherever the count falls, so one key's rows can sit in several batches. The
operator wants the opposite: all rows of a key together, so each key's state
is read and written once per micro-batch (and ``handle_input_rows`` is called
once per key, as in Spark). So the batches are gathered up to ``max_bytes``,
sorted by (partition, key columns), and the last key of the sorted chunk is
held back to join the next one, in case more of its rows follow. For batch
DataFrames Spark sorts each task's rows the same way first, so a key never
straddles two chunks whatever the input size; streaming DataFrames cannot be
sorted by Spark, so there a key straddles chunks only when a task's
micro-batch is larger than ``max_bytes``. Either way state stays correct: a
key's chunks are processed one after the other.

Grouping follows Spark: nulls equal each other, NaN equals NaN, and -0.0 is
0.0 (float key columns are normalized, so the state key is the same too).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def _nulls_per_key() -> bool:
    """Whether this pyarrow takes null placement per sort key (``(name, order, placement)``): from 25 the one
    placement for all keys is deprecated (a warning per chunk), and older versions know only that one."""
    try:
        pc.sort_indices(pa.table({"k": [1]}), sort_keys=[("k", "ascending", "at_start")])
        return True
    except (TypeError, ValueError):  # pa.ArrowInvalid is a ValueError
        return False


_NULLS_PER_KEY = _nulls_per_key()


def _normalized(table: pa.Table, keys: Sequence[str]) -> pa.Table:
    """Float key columns with -0.0 turned into 0.0 (x + 0.0), as Spark's grouping does."""
    for name in keys:
        i = table.schema.get_field_index(name)
        if pa.types.is_floating(table.schema.field(i).type):
            table = table.set_column(i, name, pc.add(table.column(i), 0.0))
    return table


def _differs(column: pa.ChunkedArray) -> np.ndarray:
    """For rows 1..n-1, whether the value differs from the row before (null == null, NaN == NaN)."""
    column = column.combine_chunks()
    after, before = column.slice(1), column.slice(0, len(column) - 1)
    ne = pc.not_equal(after, before)
    if pa.types.is_floating(column.type):
        ne = pc.and_kleene(ne, pc.invert(pc.and_(pc.is_nan(after), pc.is_nan(before))))
    if column.null_count:
        ne = pc.if_else(pc.is_null(ne), pc.xor(pc.is_null(after), pc.is_null(before)), ne)
    return ne.to_numpy(zero_copy_only=False)


def group_starts(table: pa.Table, keys: Sequence[str]) -> np.ndarray:
    """The first row of every run of equal keys in a sorted table."""
    if table.num_rows == 0:
        return np.zeros(0, dtype=np.int64)
    changes = np.zeros(table.num_rows - 1, dtype=bool)
    for name in keys:
        changes |= _differs(table.column(name))
    return np.concatenate([[0], np.flatnonzero(changes) + 1])


def _sorted(tables: list[pa.Table], partition: str, keys: Sequence[str]) -> tuple[pa.Table, np.ndarray]:
    table = _normalized(pa.concat_tables(tables), keys)
    names = [partition, *keys]
    if _NULLS_PER_KEY:
        order = pc.sort_indices(table, sort_keys=[(name, "ascending", "at_start") for name in names])
    else:
        order = pc.sort_indices(table, sort_keys=[(name, "ascending") for name in names], null_placement="at_start")
    table = table.take(order)
    return table, group_starts(table, keys)


def chunks(batches: Iterable[pa.RecordBatch], partition: str, keys: Sequence[str], max_bytes: int,
           groups: bool = True) -> Iterator[tuple[pa.Table, np.ndarray | None]]:
    """(chunk, group starts): sorted by (partition, keys), whole keys unless one key outgrows ``max_bytes``.

    ``groups=False`` (a vectorized processor takes many keys' rows at once, not a key at a time): a task's whole
    input within ``max_bytes`` comes as it arrived, unsorted, without starts (the sort was a fifth of a Python
    worker's time on a running count); only a chunk cut at ``max_bytes`` is sorted, to keep each key whole."""
    pending: list[pa.Table] = []
    size = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        pending.append(pa.Table.from_batches([batch]))
        size += batch.nbytes
        if size < max_bytes:
            continue
        table, starts = _sorted(pending, partition, keys)
        cut = int(starts[-1]) if len(starts) > 1 else table.num_rows  # one key over the budget: let it split
        yield table.slice(0, cut), starts[starts < cut]
        rest = table.slice(cut)
        pending, size = ([rest], rest.nbytes) if rest.num_rows else ([], 0)
    if pending:
        yield _sorted(pending, partition, keys) if groups else (_normalized(pa.concat_tables(pending), keys), None)
