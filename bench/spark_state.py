"""Keyed running count in Spark Structured Streaming: rockstate vs Spark's own state, on local[2].

The same events (BENCH_SPARK_EVENTS, default 1,000,000, over
BENCH_SPARK_KEYS = 100,000 bigint keys) are written once as Parquet files of
(key, ts) and read by every engine as a file stream, BENCH_SPARK_BATCHES
(default 5) micro-batches with ``trigger(availableNow=True)``; each query's
output goes to the ``noop`` sink, which consumes every row. Engines:

- rockstate, vectorized: ``transform_with_state`` with ``handle_batch``
  (a pandas groupby, one ``get_many`` and one ``put_many`` per batch), built
  on the streaming DataFrame (the natural shape) into the noop sink, and
  into Spark's Parquet file sink; and the same operator inside
  ``foreachBatch(exactly_once(...))`` writing Parquet (``ParquetSink``);
- rockstate, per key: ``handle_input_rows``, first exactly the code of the
  transformWithStateInPandas processor (a one-row DataFrame per key), then
  yielding the row as a tuple;
- Spark ``transformWithStateInPandas`` with the RocksDB state store provider;
- Spark SQL ``groupBy(key).count()`` in update mode, with the default
  (in-memory, HDFS-backed) state store and with RocksDB.

Every engine reads only the key column: Spark SQL prunes ``ts`` by itself,
the Python engines get ``select("key")`` (Spark cannot prune for a Python
function, which takes whole rows). Both rockstate engines keep their state in
a ``LocalCluster`` of 2 nodes (separate processes on the same 2 cores); every
engine uses 2 shuffle partitions.

The JVM's JIT warms up over the first streams, so each engine first runs once
untimed: the whole stream, or a small one for the slow engines. Then the
engines take turns for BENCH_SPARK_REPEAT rounds (default 3), each run from
empty state; the slow engines (one Python call and one DataFrame per key)
are timed once. The table shows medians. rockstate's final state is checked
against a bincount of the events after every timed run. Ratios are speed-ups:
the baseline's time divided by the engine's (> 1: faster than the baseline).
Goals: rockstate vectorized >= 10x transformWithStateInPandas and >= 1.0x
native (in-memory state, the faster of the two).

Key kinds: the table above has bigint keys; a second table runs the same
events with 36-character UUID-string keys and with a (tenant string, bigint)
key of two columns, rockstate vectorized against native aggregation (goal
for string keys: >= 1.0x native on the RocksDB state store), and the
operator's floor: its plan without state (the rows given their rockstate
partition, shuffled to the owner's task, one mapInArrow pass that reads
them). Spark's aggregation counts each task's rows before its shuffle
(partial aggregation: at most a row per key and task crosses it); the
operator's shuffle carries every event to Python.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql.streaming import StatefulProcessor as SparkProcessor  # noqa: E402
from pyspark.sql.types import LongType, StructField, StructType  # noqa: E402

import rockstate  # noqa: E402
from common import key_of, print_table  # noqa: E402
from rockstate.spark import ParquetSink, StatefulProcessor, close_clients, exactly_once, settle, state_name, transform_with_state  # noqa: E402
from rockstate.spark.partitioning import PARTITION_COLUMN, route_by_owner, with_partition  # noqa: E402

EVENTS = int(os.environ.get("BENCH_SPARK_EVENTS", 1_000_000))
KEYS = int(os.environ.get("BENCH_SPARK_KEYS", 100_000))
BATCHES = int(os.environ.get("BENCH_SPARK_BATCHES", 5))
REPEAT = int(os.environ.get("BENCH_SPARK_REPEAT", 3))
FILES_PER_BATCH = 2
PARTITIONS = 16
FLOOR = "floor: the operator's shuffle + mapInArrow, no state"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
OUTPUT = "key long, count long"
TWS = "Spark transformWithStateInPandas, RocksDB"
NATIVE = "Spark SQL groupBy().count(), in-memory state"
NATIVE_ROCKSDB = "Spark SQL groupBy().count(), RocksDB state"
VECTOR_PARQUET = "rockstate, vectorized, file sink"
VECTOR_FOREACH = "rockstate, vectorized, foreachBatch + exactly_once"


class RockstateCount(StatefulProcessor):
    def __init__(self, state: str) -> None:
        self.state = state


class VectorCount(RockstateCount):
    def init(self, handle):
        self.counts = handle.value_state(self.state)

    def handle_batch(self, batch: pd.DataFrame) -> pd.DataFrame:
        sizes = batch.groupby(list(batch.columns), sort=False).size()  # the key columns only: one or two
        counts = np.asarray(self.counts.get_many(sizes.index, default=0)) + sizes.to_numpy()
        self.counts.put_many(sizes.index, counts)
        return sizes.index.to_frame(index=False).assign(count=counts)


class KeyCount(RockstateCount):
    """SparkKeyCount in rockstate's API: the code a port from transformWithStateInPandas starts with."""

    def init(self, handle):
        self.count = handle.value_state(self.state)

    def handle_input_rows(self, key, rows: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        count = self.count.get(0) + sum(len(r) for r in rows)
        self.count.update(count)
        yield pd.DataFrame({"key": [key[0]], "count": [count]})


class KeyCountRows(KeyCount):
    """The same, yielding its output row as a tuple instead of a one-row DataFrame."""

    def handle_input_rows(self, key, rows: Iterator[pd.DataFrame]) -> Iterator[tuple]:
        count = self.count.get(0) + sum(len(r) for r in rows)
        self.count.update(count)
        yield (key[0], count)


class SparkKeyCount(SparkProcessor):
    def init(self, handle):
        self.count = handle.getValueState("count", StructType([StructField("count", LongType())]))

    def handleInputRows(self, key, rows, timerValues):
        count = (self.count.get()[0] if self.count.exists() else 0) + sum(len(r) for r in rows)
        self.count.update((count,))
        yield pd.DataFrame({"key": [key[0]], "count": [count]})

    def close(self):
        pass


# key kind -> (key columns, their Spark schema)
KEY_KINDS = {"int": (["key"], "key long"), "uuid": (["key"], "key string"), "tuple": (["tenant", "key"], "tenant string, key long")}


def write_events(directory: str, events: int, keys: int, seed: int, kind: str = "int") -> np.ndarray:
    """Parquet files of (key columns, ts), FILES_PER_BATCH per micro-batch; returns the count per key index."""
    rng = np.random.default_rng(seed)
    key = rng.integers(0, keys, events, dtype=np.int64)
    os.makedirs(directory)
    files = BATCHES * FILES_PER_BATCH
    names = np.array([key_of("uuid", i) for i in range(keys)], dtype=object) if kind == "uuid" else None
    for i, part in enumerate(np.array_split(key, files)):
        columns = {"key": part} if kind == "int" else {"key": pa.array(names[part], pa.string())} if kind == "uuid" else {
            "tenant": pa.array([f"tenant-{k % 1000:04d}" for k in part.tolist()], pa.string()), "key": part}
        pq.write_table(pa.table({**columns, "ts": np.arange(len(part), dtype=np.int64)}), os.path.join(directory, f"part-{i:03d}.parquet"))
    return np.bincount(key, minlength=keys)


def _nothing(batches):
    for _ in batches:
        pass
    return iter(())


class Bench:
    def __init__(self, spark: SparkSession, cluster: rockstate.LocalCluster, root: str) -> None:
        self.spark, self.cluster, self.root = spark, cluster, root
        self.runs = 0
        self.owners: list = []  # the partition table's owners, for the floor

    kind = "int"

    def stream(self, source: str, provider: str, query: Callable, mode: str, sink: str = "noop") -> float:
        """Run one availableNow stream over ``source`` into ``sink`` (noop, parquet, or exactly_once's foreachBatch
        Parquet sink); returns its wall time."""
        self.runs += 1
        self.spark.conf.set("spark.sql.streaming.stateStore.providerClass", provider)
        df = self.spark.readStream.schema(f"{KEY_KINDS[self.kind][1]}, ts long").option("maxFilesPerTrigger", FILES_PER_BATCH).parquet(source)
        out = os.path.join(self.root, f"out-{self.runs}")
        start = time.perf_counter()
        if sink == "foreachBatch":
            self.wrapper = exactly_once(lambda batch, i: ParquetSink(out)(query(batch), i), client=self.cluster.address, query=f"bench-{self.runs}")
            writer = df.writeStream.foreachBatch(self.wrapper)
        else:
            writer = query(df).writeStream.format(sink).outputMode(mode)
            if sink == "parquet":
                writer = writer.option("path", out)
        q = writer.option("checkpointLocation", os.path.join(self.root, f"chk-{self.runs}")).trigger(availableNow=True).start()
        q.awaitTermination()
        elapsed = time.perf_counter() - start
        if q.exception() is not None:
            raise RuntimeError(f"query failed: {q.exception()}")
        self.last_query = q
        shutil.rmtree(out, ignore_errors=True)
        return elapsed

    def rockstate(self, cls: type, sink: str = "noop") -> Callable[[str], float]:
        def run(source: str) -> float:
            processor = cls("count")
            columns, schema = KEY_KINDS[self.kind]
            elapsed = self.stream(source, HDFS, lambda df: transform_with_state(
                df.select(*columns), columns, processor, f"{schema}, count long", self.cluster.address), "append", sink)
            # the last batch's state, applied now (the next batch would); then where the count lives
            if sink == "foreachBatch":
                self.wrapper.settle(self.last_query)
                self.last_state = state_name(self.wrapper.query, cls.__name__, "count")
            else:
                settle(self.last_query, self.cluster.address)
                self.last_state = state_name(self.last_query, cls.__name__, "count")
            return elapsed

        return run

    def floor(self, source: str) -> float:
        """The operator's plan without state: the rows given their rockstate partition, shuffled to its owner's
        task, one mapInArrow pass that reads them and answers nothing."""
        columns = KEY_KINDS[self.kind][0]
        owners = self.owners

        def query(df):
            routed = route_by_owner(with_partition(df.select(*columns), columns, len(owners)), PARTITION_COLUMN, owners, 2)
            return routed.mapInArrow(_nothing, KEY_KINDS[self.kind][1])

        return self.stream(source, HDFS, query, "append")

    def tws(self, source: str) -> float:
        return self.stream(source, ROCKSDB, lambda df: df.select("key").groupBy("key").transformWithStateInPandas(
            SparkKeyCount(), OUTPUT, "Update", "None"), "update")

    def native(self, provider: str) -> Callable[[str], float]:
        return lambda source: self.stream(source, provider, lambda df: df.groupBy(*KEY_KINDS[self.kind][0]).count(), "update")


def main() -> None:
    root = tempfile.mkdtemp(prefix="rockstate-bench-spark-")
    spark = (
        SparkSession.builder.master("local[2]").appName("rockstate-bench-spark")
        .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "4g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    events, warmup = os.path.join(root, "events"), os.path.join(root, "warmup")
    try:
        with rockstate.LocalCluster(nodes=2, partitions=PARTITIONS, root=os.path.join(root, "cluster")) as cluster:
            expected = write_events(events, EVENTS, KEYS, seed=1).tolist()
            write_events(warmup, min(EVENTS, 20_000), min(KEYS, 1_000), seed=2)
            bench = Bench(spark, cluster, root)
            # name: (run, warm-up source, timed runs); the slow engines warm up on a small stream and run once
            engines = {
                "rockstate, vectorized (handle_batch)": (bench.rockstate(VectorCount), events, REPEAT),
                VECTOR_PARQUET: (bench.rockstate(VectorCount, "parquet"), events, REPEAT),
                VECTOR_FOREACH: (bench.rockstate(VectorCount, "foreachBatch"), events, REPEAT),
                "rockstate, per key, yielding DataFrames": (bench.rockstate(KeyCount), warmup, 1),
                "rockstate, per key, yielding tuples": (bench.rockstate(KeyCountRows), warmup, REPEAT),
                TWS: (bench.tws, warmup, 1),
                NATIVE: (bench.native(HDFS), events, REPEAT),
                NATIVE_ROCKSDB: (bench.native(ROCKSDB), events, REPEAT),
            }
            samples: dict[str, list[float]] = {name: [] for name in engines}
            with cluster.connect() as rs:

                def timed(name: str, source: str) -> float:
                    elapsed = engines[name][0](source)
                    if name.startswith("rockstate") and source == events:
                        got = rs.value_state(bench.last_state).get_many(range(KEYS), default=0)
                        assert got == expected, f"{name}: wrong counts"
                    return elapsed

                for name, (_, source, _) in engines.items():
                    timed(name, source)
                for done in range(1, REPEAT + 1):  # engines take turns, so drift on the machine hits all alike
                    for name, (_, _, runs) in engines.items():
                        if len(samples[name]) < runs:
                            samples[name].append(timed(name, events))
                            print(f"round {done}: {name} {samples[name][-1]:.2f}s", flush=True)
                bench.owners = rs.backend.table.owners
                kinds_rows = key_kinds(bench, rs, root)
            close_clients()
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)

    times = {name: float(np.median(s)) for name, s in samples.items()}
    rows = [[name, len(samples[name]), t, EVENTS / t / 1e3, times[TWS] / t, times[NATIVE] / t, times[NATIVE_ROCKSDB] / t]
            for name, t in times.items()]
    print_table(
        f"spark state: running count, {EVENTS:,} events over {KEYS:,} keys, {BATCHES} micro-batches, local[2] "
        "(goals for rockstate vectorized: >= 10x TWS-in-pandas, >= 1.0x native in-memory)",
        ["engine", "runs", "median s", "k events/s", "x TWS-in-pandas", "x native (mem)", "x native (RocksDB)"],
        rows,
    )
    print(f"natural shape with a file sink vs the foreachBatch shape (both Parquet out): "
          f"{times[VECTOR_FOREACH] / times[VECTOR_PARQUET]:.2f}x (goal: within 10%, 0.90x or more)")
    print_table(
        f"spark state by key kind: the same running count, {EVENTS:,} events over {KEYS:,} keys, median of {REPEAT} "
        "(goal for UUID-string keys: rockstate vectorized >= 1.0x native on RocksDB)",
        ["keys", "engine", "median s", "k events/s", "x native (mem)", "x native (RocksDB)"],
        kinds_rows,
    )


def key_kinds(bench: Bench, rs, root: str) -> list[list]:
    """rockstate vectorized against native aggregation, per key kind; every rockstate run's counts checked."""
    rows = []
    for kind in KEY_KINDS:
        bench.kind = kind
        events = os.path.join(root, f"events-{kind}")
        expected = write_events(events, EVENTS, KEYS, seed=1, kind=kind).tolist()
        keys = [key_of(kind, i) for i in range(KEYS)]
        engines = {"rockstate, vectorized": bench.rockstate(VectorCount), NATIVE: bench.native(HDFS), NATIVE_ROCKSDB: bench.native(ROCKSDB),
                   FLOOR: bench.floor}
        samples: dict[str, list[float]] = {name: [] for name in engines}
        for _ in range(REPEAT):
            for name, run in engines.items():
                samples[name].append(run(events))
                if name.startswith("rockstate"):
                    assert rs.value_state(bench.last_state).get_many(keys, default=0) == expected, f"{kind}: wrong counts"
        times = {name: float(np.median(s)) for name, s in samples.items()}
        rows += [[kind, name, t, EVENTS / t / 1e3, times[NATIVE] / t, times[NATIVE_ROCKSDB] / t] for name, t in times.items()]
    bench.kind = "int"
    return rows


if __name__ == "__main__":
    main()
