"""The streaming sink: the latest change per key kept in state, rockstate's sink vs Spark's own state, on local[2].

A change stream of BENCH_SINK_ROWS (500,000) rows over BENCH_SINK_KEYS
(100,000) UUID-string keys, each row (key, amount decimal(12,2), at
timestamp), read as a file stream of Parquet files, BENCH_SINK_BATCHES (5)
micro-batches (``availableNow``). Engines, each from empty state:

- rockstate's sink: ``writeStream.format("rockstate")``, the key's value
  ``struct(amount, at)``, exactly once by batch id (``spark/sink.py``), into
  a ``LocalCluster`` of 2 nodes with the default backup;
- ``foreachBatch`` + ``put_many`` on the driver (the batch collected as
  Arrow, one ``put_many``): what a hand-written sink does, at least once;
- Spark SQL ``groupBy(key).agg(last(amount), last(at))`` in update mode
  into ``noop``: Spark keeping the latest row per key in its state store,
  on RocksDB and on the in-memory store.

Engines take turns for BENCH_SINK_REPEAT (3) rounds after one untimed run
each; the table shows medians and ratios (the baseline's time over the
engine's: > 1 is faster). rockstate's state is checked against the last
change per key after every run.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import sys
import tempfile
import time
from decimal import Decimal

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

import rockstate  # noqa: E402
from common import key_of, print_table  # noqa: E402
from rockstate.spark import close_clients, register_data_source  # noqa: E402

ROWS = int(os.environ.get("BENCH_SINK_ROWS", 500_000))
KEYS = int(os.environ.get("BENCH_SINK_KEYS", 100_000))
BATCHES = int(os.environ.get("BENCH_SINK_BATCHES", 5))
REPEAT = int(os.environ.get("BENCH_SINK_REPEAT", 3))
SCHEMA = "key string, amount decimal(12,2), at timestamp"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
SINK, DRIVER = "rockstate sink (exactly once)", "foreachBatch + put_many (at least once)"
NATIVE, NATIVE_MEM = "Spark SQL last() per key, RocksDB state", "Spark SQL last() per key, in-memory state"


def write_changes(directory: str) -> dict:
    """Parquet files of changes, one per micro-batch; returns the last (amount, at) per key."""
    rng = np.random.default_rng(7)
    names = np.array([key_of("uuid", i) for i in range(KEYS)], dtype=object)
    keys = rng.integers(0, KEYS, ROWS)
    cents = rng.integers(0, 10**8, ROWS)
    at = np.datetime64("2026-11-01T00:00:00", "us") + np.arange(ROWS).astype("timedelta64[s]")
    os.makedirs(directory)
    for i, part in enumerate(np.array_split(np.arange(ROWS), BATCHES)):
        table = pa.table({"key": pa.array(names[keys[part]], pa.string()),
                          "amount": pa.array([Decimal(int(c)).scaleb(-2) for c in cents[part].tolist()], pa.decimal128(12, 2)),
                          "at": pa.array(at[part], pa.timestamp("us", tz="UTC"))})
        pq.write_table(table, os.path.join(directory, f"part-{i:03d}.parquet"))
        os.utime(os.path.join(directory, f"part-{i:03d}.parquet"), (1_700_000_000 + i, 1_700_000_000 + i))
    last = {}
    for k, c, t in zip(keys.tolist(), cents.tolist(), at.tolist()):  # rows in order: the later one wins
        last[names[k]] = (Decimal(c).scaleb(-2), t.replace(tzinfo=dt.timezone.utc))
    return last


class Bench:
    def __init__(self, spark: SparkSession, cluster: rockstate.LocalCluster, root: str, source: str) -> None:
        self.spark, self.cluster, self.root, self.source = spark, cluster, root, source
        self.runs = 0

    def _start(self, writer, provider: str = HDFS) -> float:
        self.runs += 1
        self.spark.conf.set("spark.sql.streaming.stateStore.providerClass", provider)
        start = time.perf_counter()
        query = writer.option("checkpointLocation", os.path.join(self.root, f"chk-{self.runs}")).trigger(availableNow=True).start()
        query.awaitTermination()
        if query.exception() is not None:
            raise RuntimeError(f"query failed: {query.exception()}")
        return time.perf_counter() - start

    def changes(self):
        return self.spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(self.source)

    def sink(self) -> float:
        self.state = f"sink-{self.runs + 1}"
        df = self.changes().select("key", F.struct("amount", "at").alias("value"))
        return self._start(df.writeStream.format("rockstate").option("address", self.cluster.address).option("state", self.state))

    def driver(self) -> float:
        self.state = f"driver-{self.runs + 1}"
        address, state = self.cluster.address, self.state

        def each(batch, batch_id):
            table = batch.toArrow()
            with rockstate.connect(address) as rs:
                values = [{"amount": a, "at": t} for a, t in zip(table.column("amount").to_pylist(), table.column("at").to_pylist())]
                rs.value_state(state).put_many(table.column("key"), values)

        return self._start(self.changes().writeStream.foreachBatch(each))

    def native(self, provider: str):
        def run() -> float:
            df = self.changes().groupBy("key").agg(F.last("amount").alias("amount"), F.last("at").alias("at"))
            return self._start(df.writeStream.format("noop").outputMode("update"), provider)

        return run


def main() -> None:
    root = tempfile.mkdtemp(prefix="rockstate-bench-sink-")
    spark = (SparkSession.builder.master("local[2]").appName("rockstate-bench-sink")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "4g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register_data_source(spark)
    try:
        with rockstate.LocalCluster(nodes=2, partitions=16, root=os.path.join(root, "cluster")) as cluster:
            expected = write_changes(os.path.join(root, "changes"))
            keys = sorted(expected)
            bench = Bench(spark, cluster, root, os.path.join(root, "changes"))
            engines = {SINK: bench.sink, DRIVER: bench.driver, NATIVE: bench.native(ROCKSDB), NATIVE_MEM: bench.native(HDFS)}
            samples: dict[str, list[float]] = {name: [] for name in engines}
            with cluster.connect() as rs:
                for rnd in range(REPEAT + 1):  # round 0 warms the JVM and the workers up, untimed
                    for name, run in engines.items():
                        elapsed = run()
                        if name in (SINK, DRIVER):
                            got = rs.value_state(bench.state).get_many(keys)
                            assert [(v["amount"], v["at"]) for v in got] == [expected[k] for k in keys], f"{name}: wrong state"
                        if rnd:
                            samples[name].append(elapsed)
                            print(f"round {rnd}: {name} {elapsed:.2f}s", flush=True)
            close_clients()
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    times = {name: float(np.median(s)) for name, s in samples.items()}
    print_table(f"streaming sink: the latest of {ROWS:,} changes over {KEYS:,} UUID keys, {BATCHES} micro-batches, local[2]",
                ["engine", "runs", "median s", "k rows/s", "x native (RocksDB)", "x native (mem)"],
                [[name, len(samples[name]), t, ROWS / t / 1e3, times[NATIVE] / t, times[NATIVE_MEM] / t] for name, t in times.items()])


if __name__ == "__main__":
    main()
