"""Co-partitioning in the JVM: the rockstate partition of every row, and tasks that follow owners.

``with_partition`` adds ``pmod(hash(key columns), P)`` computed by Spark SQL
itself, so no row goes through Python to find its partition. It equals
``rockstate.partition_of(key, P)`` because Spark's ``hash`` is what rockstate
implements; Spark hashes int/smallint/tinyint with ``hashInt`` and float with
``floatToIntBits`` though, while a Python int is a bigint and a Python float a
double, so such key columns are cast to bigint / double for the hash (the
column itself is left as it is).

``route_by_owner`` then shuffles the rows so that each Spark task gets whole
rockstate partitions, all of one owner when there are at least as many tasks
as owners: a task's state requests go to as few nodes as possible. Spark's
``repartition(n, expr)`` puts a row in task ``pmod(hash(expr), n)``; the
driver knows the partition table, so it picks, for every rockstate partition,
a bigint whose hash lands in the task chosen for it, and the shuffle
expression looks that number up by partition. A table that changes later
only makes the routing less tight: requests are routed by the current table.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..errors import ConfigError, InvalidKeyError
from ..keys import partition_of

PARTITION_COLUMN = "_rockstate_partition"

_AS_BIGINT = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
_AS_DOUBLE = (T.FloatType, T.DoubleType)
_AS_IS = (T.BooleanType, T.BinaryType)


def key_names(keys: str | Sequence[str]) -> list[str]:
    names = [keys] if isinstance(keys, str) else list(keys)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise InvalidKeyError(f"keys must be a column name or a non-empty list of column names, got {keys!r}")
    return names


def _binary_collation(dtype: T.StringType) -> bool:
    """Whether a string column compares (and hashes) by its bytes: always before Spark 4.0, which has no collations."""
    is_binary = getattr(dtype, "isUTF8BinaryCollation", None)
    return True if is_binary is None else bool(is_binary())


def key_columns(df: DataFrame, keys: str | Sequence[str]) -> list[Column]:
    """The key columns as rockstate hashes them: integers as bigint, floating point as double."""
    fields = {f.name: f.dataType for f in df.schema.fields}
    columns = []
    for name in key_names(keys):
        if name not in fields:
            raise InvalidKeyError(f"key column {name!r} is not in the DataFrame; its columns are {sorted(fields)}")
        dtype = fields[name]
        if isinstance(dtype, _AS_BIGINT):
            columns.append(F.col(name).cast("bigint"))
        elif isinstance(dtype, _AS_DOUBLE):
            columns.append(F.col(name).cast("double"))
        elif isinstance(dtype, _AS_IS) or (isinstance(dtype, T.StringType) and _binary_collation(dtype)):
            columns.append(F.col(name))
        else:
            raise InvalidKeyError(
                f"key column {name!r} is {dtype.simpleString()}; a rockstate key column is an integer, "
                "floating-point, boolean, string (UTF8_BINARY collation) or binary column",
                type=dtype.simpleString(),
            )
    return columns


def partition_column(df: DataFrame, keys: str | Sequence[str], partitions: int) -> Column:
    """``pmod(hash(keys...), partitions)``: the rockstate partition of each row, as an int."""
    if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
        raise ConfigError(f"partitions must be a positive int, got {partitions!r}")
    return F.pmod(F.hash(*key_columns(df, keys)), F.lit(partitions))


def with_partition(df: DataFrame, keys: str | Sequence[str], partitions: int, column: str = PARTITION_COLUMN) -> DataFrame:
    """``df`` with ``column`` = the rockstate partition of the row's key, computed by Spark.

    ``keys`` are the key columns in order (a rockstate key is the scalar of
    one column, the tuple of several); ``partitions`` is the cluster's P.
    """
    return df.withColumn(column, partition_column(df, keys, partitions))


def task_of_partition(owners: Sequence[str | None], tasks: int) -> list[int]:
    """The Spark task of each rockstate partition, so that tasks mix owners as little as possible.

    With at least as many tasks as owners, every owner gets whole tasks, as
    many as its share of the partitions allows (each task then talks to one
    owner); with fewer, every owner's partitions go to one task, the least
    loaded so far (each owner is then talked to by one task).
    """
    by_owner: dict[str, list[int]] = {}
    for pid, owner in enumerate(owners):
        by_owner.setdefault(owner or "", []).append(pid)
    groups = [by_owner[o] for o in sorted(by_owner)]
    task = [0] * len(owners)
    if tasks >= len(groups):
        shares = [1] * len(groups)
        for _ in range(min(tasks, len(owners)) - len(groups)):  # next task to the owner with most partitions per task
            best = max(range(len(groups)), key=lambda g: len(groups[g]) / shares[g])
            shares[best] += 1
        first = 0
        for pids, share in zip(groups, shares):
            for j, pid in enumerate(pids):
                task[pid] = first + j * share // len(pids)
            first += share
    else:
        load = [0] * tasks
        for pids in sorted(groups, key=len, reverse=True):
            t = load.index(min(load))
            load[t] += len(pids)
            for pid in pids:
                task[pid] = t
    return task


def bigint_landing_in(tasks: int) -> list[int]:
    """For each task t, the smallest bigint v >= 0 with ``pmod(hash(v), tasks) == t``."""
    found: dict[int, int] = {}
    v = 0
    while len(found) < tasks:
        found.setdefault(partition_of(v, tasks), v)
        v += 1
    return [found[t] for t in range(tasks)]


def route_by_owner(df: DataFrame, partition_col: str, owners: Sequence[str | None], tasks: int) -> DataFrame:
    """Shuffle ``df`` into ``min(tasks, P)`` tasks, each holding whole partitions of as few owners as possible.

    A row whose partition column is P + t (a marker, see ``with_markers``) goes to task t.
    """
    tasks = max(1, min(tasks, len(owners)))
    landing = bigint_landing_in(tasks)
    # one SQL expression, not a lit() per partition: inside foreachBatch this is built every micro-batch, and each
    # Column made on the driver is a call into the JVM
    numbers = ", ".join(f"{landing[t]}L" for t in [*task_of_partition(owners, tasks), *range(tasks)])
    return df.repartition(tasks, F.expr(f"array({numbers})")[F.col(partition_col)])


def with_markers(df: DataFrame, partition_col: str, partitions: int, tasks: int) -> DataFrame:
    """``df`` plus, from every input partition that has rows, one marker row for each task (partition column P + t).

    A task of a streaming ``mapInArrow`` cannot tell which of the shuffle's
    partitions it holds (under a union its ``partitionId`` is the union's), yet
    timers must fire on every rockstate partition, rows or not: a marker tells
    the task its number. Markers copy a real row otherwise; the task drops them.
    """
    tasks = max(1, min(tasks, partitions))
    index = df.columns.index(partition_col)

    def mark(batches):
        marked = False
        for batch in batches:
            beats = pc.equal(batch.column(index), HEARTBEAT)
            rows = batch.filter(pc.invert(beats)) if pc.any(beats).as_py() else batch
            if rows.num_rows:
                yield rows
            if not marked and batch.num_rows:
                marked = True
                copies = pa.Table.from_batches([batch.slice(0, 1)] * tasks)
                ids = pa.array(range(partitions, partitions + tasks), type=copies.schema.field(index).type)
                yield from copies.set_column(index, copies.schema.field(index), ids).to_batches()

    return df.mapInArrow(mark, df.schema)


HEARTBEAT = -1  # the partition column of a heartbeat row: it makes markers, then is dropped (see ``with_markers``)


def heartbeat(session, schema: T.StructType, partition_col: str) -> DataFrame:
    """A stream of one row a second with ``schema``'s columns (nulls) and partition ``HEARTBEAT``: unioned with the
    input, it makes every micro-batch reach every task of the operator, so timers fire without input."""
    rate = session.readStream.format("rate").option("rowsPerSecond", 1).load()
    return rate.select(*[(F.lit(HEARTBEAT) if f.name == partition_col else F.lit(None)).cast(f.dataType).alias(f.name)
                         for f in schema.fields])
