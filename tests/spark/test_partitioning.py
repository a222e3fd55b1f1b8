"""with_partition and owner routing, checked on real Spark against rockstate's own partitioner."""

import math
import random

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from rockstate import partition_of
from rockstate.errors import InvalidKeyError
from rockstate.spark import PARTITION_COLUMN, with_partition
from rockstate.spark.partitioning import route_by_owner, task_of_partition

rng = random.Random(7)
N = 2000

COLUMNS = {
    "tiny": (T.ByteType(), lambda: rng.randint(-128, 127), [0, -1, 127, -128]),
    "small": (T.ShortType(), lambda: rng.randint(-(2**15), 2**15 - 1), [0, -1, 2**15 - 1]),
    "int": (T.IntegerType(), lambda: rng.randint(-(2**31), 2**31 - 1), [0, -1, 2**31 - 1, -(2**31)]),
    "big": (T.LongType(), lambda: rng.getrandbits(64) - 2**63, [0, -1, 2**63 - 1, -(2**63)]),
    "f32": (T.FloatType(), lambda: rng.uniform(-1e6, 1e6), [0.0, -0.0, math.nan, math.inf, 1.5]),
    "f64": (T.DoubleType(), lambda: rng.uniform(-1e12, 1e12), [0.0, -0.0, math.nan, -math.inf, 0.1]),
    "str": (T.StringType(), lambda: "".join(rng.choice("abcé日😀") for _ in range(rng.randint(0, 9))), ["", "a", "日本語"]),
    "bin": (T.BinaryType(), lambda: rng.randbytes(rng.randint(0, 9)), [b"", b"\xff"]),
    "flag": (T.BooleanType(), lambda: rng.random() < 0.5, [True, False]),
}


@pytest.fixture(scope="module")
def keys_df(spark):
    names = list(COLUMNS)
    columns = []
    for name in names:
        _, make, edges = COLUMNS[name]
        columns.append(edges + [None] + [None if rng.random() < 0.05 else make() for _ in range(N - len(edges) - 1)])
    schema = T.StructType([T.StructField("id", T.LongType())] + [T.StructField(n, COLUMNS[n][0]) for n in names])
    return spark.createDataFrame([(i, *row) for i, row in enumerate(zip(*columns))], schema)


KEY_SETS = [["tiny"], ["small"], ["int"], ["big"], ["f32"], ["f64"], ["str"], ["bin"], ["flag"],
            ["int", "str"], ["str", "f32", "tiny"], ["flag", "bin", "big", "f64"]]  # fmt: skip


@pytest.mark.parametrize("keys", KEY_SETS, ids=["-".join(k) for k in KEY_SETS])
def test_partition_column_equals_rockstate_partition_of(keys_df, keys):
    for partitions in (8, 7, 128):
        rows = with_partition(keys_df, keys, partitions).select(*keys, PARTITION_COLUMN).collect()
        assert len(rows) == N
        for row in rows:
            key = row[keys[0]] if len(keys) == 1 else tuple(row[k] for k in keys)
            assert row[PARTITION_COLUMN] == partition_of(key, partitions), (keys, key)


def test_unsupported_key_column_is_refused(spark):
    df = spark.range(3).select(F.col("id").cast("decimal(10,2)").alias("d"), F.current_date().alias("day"))
    for column in ("d", "day", "missing"):
        with pytest.raises(InvalidKeyError, match=column):
            with_partition(df, column, 8)


def test_route_by_owner_puts_each_partition_in_its_planned_task(spark):
    owners = ["b", "a", "b", "a", "c", "a", "c", "b", "a"]
    df = spark.range(len(owners)).select(F.col("id").cast("int").alias(PARTITION_COLUMN))
    for tasks in (1, 2, 3, 5, 9):
        planned = task_of_partition(owners, tasks)
        routed = route_by_owner(df, PARTITION_COLUMN, owners, tasks).select(PARTITION_COLUMN, F.spark_partition_id().alias("task"))
        got = {r[PARTITION_COLUMN]: r["task"] for r in routed.collect()}
        assert got == dict(enumerate(planned))  # Spark put every partition where the plan said
        assert set(planned) == set(range(tasks))  # no idle task
        owners_of = {t: {owners[p] for p, pt in enumerate(planned) if pt == t} for t in set(planned)}
        tasks_of = {o: {planned[p] for p, po in enumerate(owners) if po == o} for o in set(owners)}
        if tasks >= 3:
            assert all(len(os) == 1 for os in owners_of.values())  # each task talks to one owner
        else:
            assert all(len(ts) == 1 for ts in tasks_of.values())  # each owner hears from one task
