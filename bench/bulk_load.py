"""Bulk load vs put_many: BENCH_BULK_KEYS (default 300,000) rows per key kind into a value state of a 2-node cluster.

The rows are (key, value string "v<id>"), per key kind: a bigint spread over
the whole msgpack integer range (negative ones too); a 36-character UUID
string (md5 of the id, as bench/common.py makes it); a (tenant id string,
bigint) tuple of two columns. Engines, each into a fresh state:

- ``bulk_load``: the rows come from a Spark DataFrame (``spark.range``, on
  local[2]); Spark computes each row's partition and shuffles whole
  partitions to tasks; each task sorts, writes one SST file per partition and
  ships it to the owner, which ingests it. Timed end to end, the Spark job
  included.
- ``bulk_load(shuffle=False)``: the same without Spark's shuffle: each of
  the DataFrame's tasks computes partitions itself and writes a file per
  partition it has rows of.
- ``put_many`` from the driver: the same rows as Python lists, already in the
  driver (collecting them is not timed), written in batches of BATCH keys.
- Spark alone, as a floor: the same DataFrame, partition column and shuffle
  into the same tasks, with a ``mapInArrow`` that only counts the rows.

Every state is defined before its load is timed (defining one takes the
coordinator ~0.1 s). The coordinator, both nodes and Spark share this
machine's cores. A small
bulk load runs first, untimed (JVM JIT, Python workers). Medians of
BENCH_BULK_REPEAT runs (default 3). Each run's state is checked by sampling
keys. Goal: bulk_load >= 1,000,000 keys/s.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"

import pyarrow as pa  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

import rockstate  # noqa: E402
from common import KEY_KINDS, key_of, print_table  # noqa: E402
from rockstate.spark import bulk_load, close_clients  # noqa: E402
from rockstate.spark.partitioning import PARTITION_COLUMN, route_by_owner, with_partition  # noqa: E402

N = int(os.environ.get("BENCH_BULK_KEYS", 300_000))
REPEAT = int(os.environ.get("BENCH_BULK_REPEAT", 3))
PARTITIONS = 16
BATCH = 10_000


KEY_COLUMNS = {"int": ["key"], "uuid": ["key"], "tuple": ["tenant", "key"]}


def rows(spark: SparkSession, n: int, kind: str):
    ids = F.col("id")
    value = F.concat(F.lit("v"), ids.cast("string")).alias("value")
    if kind == "int":
        return spark.range(n).select((ids * 2_654_435_761 % 4_000_000_007 - 2_000_000_000).alias("key"), value)
    if kind == "uuid":
        h = F.md5(ids.cast("string"))
        parts = [F.substring(h, a, b) for a, b in ((1, 8), (9, 4), (13, 4), (17, 4), (21, 12))]
        return spark.range(n).select(F.concat_ws("-", *parts).alias("key"), value)
    return spark.range(n).select(F.format_string("tenant-%04d", ids % 1000).alias("tenant"), ids.alias("key"), value)


def expected_key(kind: str, i: int):
    return i * 2_654_435_761 % 4_000_000_007 - 2_000_000_000 if kind == "int" else key_of(kind, i)


def count_rows(batches):
    n = 0
    for batch in batches:
        n += batch.num_rows
    yield pa.RecordBatch.from_pydict({"n": [n]})


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def main() -> None:
    root = tempfile.mkdtemp(prefix="rockstate-bench-bulk-")
    spark = (
        SparkSession.builder.master("local[2]").appName("rockstate-bench-bulk")
        .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "4g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    tables = []
    try:
        with rockstate.LocalCluster(nodes=2, partitions=PARTITIONS, root=os.path.join(root, "cluster"),
                                    node_memory_bytes=256 << 20) as cluster, cluster.connect() as rs:
            bulk_load(rows(spark, 20_000, "int"), "warmup", "key", "value", rs)
            for kind in KEY_KINDS:
                tables.append(run(spark, rs, kind))
            close_clients()
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    for kind, table in tables:
        print_table(
            f"bulk load, {kind} keys: {N:,} rows ({' + '.join(KEY_COLUMNS[kind])} key, string value) into a value state,"
            f" P={PARTITIONS}, 2 nodes, Spark local[2], median of {REPEAT} (goal: bulk_load >= 1,000,000 keys/s)",
            ["engine", "seconds", "keys/s", "ratio vs put_many"],
            table,
        )


def run(spark: SparkSession, rs, kind: str):
    df = rows(spark, N, kind)
    key = KEY_COLUMNS[kind] if len(KEY_COLUMNS[kind]) > 1 else "key"
    keys = [expected_key(kind, i) for i in range(N)]
    values = [f"v{i}" for i in range(N)]
    sample = list(range(0, N, max(1, N // 1000)))
    tasks = spark.sparkContext.defaultParallelism
    owners = [rs.backend.table.owner_address(pid) for pid in range(PARTITIONS)]

    bulk, direct, puts, floor, files = [], [], [], [], {}
    for rep in range(REPEAT):
        for shuffle, times in ((True, bulk), (False, direct)):
            name = f"bulk-{kind}-{rep}-{'shuffled' if shuffle else 'direct'}"
            rs.value_state(name, create=True)  # defined before the clock starts, as for put_many
            result = bulk_load(df, name, key, "value", rs, shuffle=shuffle)
            assert result.rows == N, result
            times.append(result.seconds)
            files[shuffle] = result.files
            state = rs.value_state(name)
            assert state.get_many([keys[i] for i in sample]) == [values[i] for i in sample]

        state = rs.value_state(f"put-{kind}-{rep}")
        start = time.perf_counter()
        for a in range(0, N, BATCH):
            state.put_many(keys[a:a + BATCH], values[a:a + BATCH])
        puts.append(time.perf_counter() - start)
        assert state.get_many([keys[i] for i in sample]) == [values[i] for i in sample]

        start = time.perf_counter()
        shuffled = route_by_owner(with_partition(df, key, PARTITIONS), PARTITION_COLUMN, owners, tasks)
        counted = shuffled.mapInArrow(count_rows, "n long").agg(F.sum("n")).collect()[0][0]
        floor.append(time.perf_counter() - start)
        assert counted == N
    put_rate = N / median(puts)
    table = [
        ["put_many from the driver", median(puts), put_rate, 1.0],
        [f"bulk_load ({files[True]} SST files, {tasks} tasks)", median(bulk), N / median(bulk), N / median(bulk) / put_rate],
        [f"bulk_load(shuffle=False) ({files[False]} SST files)", median(direct), N / median(direct), N / median(direct) / put_rate],
        ["Spark alone: partition + shuffle + count", median(floor), N / median(floor), N / median(floor) / put_rate],
    ]
    return kind, table


if __name__ == "__main__":
    main()
