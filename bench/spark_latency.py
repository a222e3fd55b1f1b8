"""Small micro-batches: the latency of one batch of a running count, rockstate vs Spark's own state, on local[2].

A running count over BENCH_LATENCY_KEYS (100,000) bigint keys, read as a
file stream of one Parquet file of (key, ts) per trigger
(``maxFilesPerTrigger`` 1, ``availableNow``), --batches (40) micro-batches
of each size in --sizes (1,000 and 10,000 events per batch), into the
``noop`` sink. What a batch costs is Spark's ``triggerExecution`` of it
(``query.recentProgress``' ``durationMs``); the first --warmup (8) batches
of every stream are left out, the table shows p50 and p90 of the rest.
Engines, each from empty state:

- Spark SQL ``groupBy(key).count()`` in update mode on the RocksDB state
  store provider: the baseline (native);
- Spark ``transformWithStateInPandas`` (RocksDB state store);
- rockstate ``transform_with_state`` (``handle_batch``: one ``get_many`` and
  one ``put_many`` per task) on the streaming DataFrame (the natural shape),
  the same operator inside ``foreachBatch(exactly_once(...))`` writing
  to ``noop``, and inside a plain ``foreachBatch`` (exactly once by the
  operator's own protocol, without exactly_once's re-run on a restore:
  the wrapper's floor); their state in a ``LocalCluster`` of --nodes (3) node
  processes with the default backup (one synchronous backup per partition);
- the floor: the operator's plan without state -- the rows given their
  rockstate partition and shuffled as the operator does, into one
  ``mapInArrow`` pass that emits nothing: what Spark's micro-batch, the
  shuffle and a Python pass cost before any state is touched.

Every engine uses 2 shuffle partitions. Streams run one after another, each
engine once per size, --rounds times (engines take turns, so drift on the
shared machine hits them alike; percentiles are over every round's batches).
Ratios are the engine's time over native's (<= 1: as fast as native or
faster). rockstate's final counts are checked against the events after
every run. Goal (issue 32): rockstate's p50 and p90 <= 1.0x native at both
sizes.

    .venv/bin/python bench/spark_latency.py                    # the full run
    .venv/bin/python bench/spark_latency.py --batches 16 --sizes 1000 --engines rockstate,floor
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"

from pyspark import cloudpickle  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

import rockstate  # noqa: E402
from common import print_table  # noqa: E402
from rockstate.spark import close_clients, exactly_once, settle, state_name, transform_with_state  # noqa: E402
from rockstate.spark.partitioning import PARTITION_COLUMN, route_by_owner, with_partition  # noqa: E402
import spark_state  # noqa: E402
from spark_state import OUTPUT, ROCKSDB, SparkKeyCount, VectorCount  # noqa: E402

cloudpickle.register_pickle_by_value(spark_state)  # the processors travel to the Python workers by value, as __main__'s

KEYS = int(os.environ.get("BENCH_LATENCY_KEYS", 100_000))
NATIVE = "Spark SQL groupBy().count(), RocksDB state"
TWS = "Spark transformWithStateInPandas, RocksDB"
NATURAL = "rockstate, operator on the stream"
EXACTLY_ONCE = "rockstate, inside foreachBatch(exactly_once)"
FOREACH = "rockstate, inside plain foreachBatch"  # exactly once by the operator's own protocol; exactly_once's floor
FLOOR = "floor: the operator's shuffle + mapInArrow, no state"
ENGINES = (NATIVE, TWS, NATURAL, EXACTLY_ONCE, FOREACH, FLOOR)


def _nothing(batches):
    for _ in batches:
        pass
    return iter(())


def write_events(directory: str, size: int, batches: int, seed: int) -> np.ndarray:
    """One Parquet file of ``size`` (key, ts) rows per batch; returns the count per key."""
    rng = np.random.default_rng(seed)
    key = rng.integers(0, KEYS, size * batches, dtype=np.int64)
    os.makedirs(directory)
    for i, part in enumerate(np.split(key, batches)):
        pq.write_table(pa.table({"key": part, "ts": np.arange(len(part), dtype=np.int64)}),
                       os.path.join(directory, f"part-{i:04d}.parquet"))
    return np.bincount(key, minlength=KEYS)


class Bench:
    def __init__(self, spark: SparkSession, cluster: rockstate.LocalCluster, root: str, owners: list) -> None:
        self.spark, self.cluster, self.root, self.owners = spark, cluster, root, owners
        self.runs = 0

    def stream(self, source: str, engine: str) -> tuple[list[float], str | None]:
        """Run one stream of ``engine`` over ``source``; returns every batch's triggerExecution (s) and, for rockstate,
        the full name of its count state."""
        self.runs += 1
        self.spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
        df = self.spark.readStream.schema("key long, ts long").option("maxFilesPerTrigger", 1).parquet(source)
        address, query_name = self.cluster.address, f"latency-{self.runs}"
        wrapper = None
        if engine == NATIVE:
            writer = df.groupBy("key").count().writeStream.outputMode("update").format("noop")
        elif engine == TWS:
            writer = (df.select("key").groupBy("key").transformWithStateInPandas(SparkKeyCount(), OUTPUT, "Update", "None")
                      .writeStream.outputMode("update").format("noop"))
        elif engine == FLOOR:
            owners = self.owners
            routed = route_by_owner(with_partition(df.select("key"), "key", len(owners)), PARTITION_COLUMN, owners, 2)
            writer = routed.mapInArrow(_nothing, "key long").writeStream.format("noop")
        elif engine == NATURAL:
            writer = transform_with_state(df.select("key"), "key", VectorCount("count"), OUTPUT, address).writeStream.format("noop")
        else:
            def sink(batch, batch_id):
                transform_with_state(batch.select("key"), "key", VectorCount("count"), OUTPUT, address) \
                    .write.format("noop").mode("overwrite").save()

            if engine == FOREACH:
                writer = df.writeStream.foreachBatch(sink)
            else:
                wrapper = exactly_once(sink, client=address, query=query_name)
                writer = df.writeStream.foreachBatch(wrapper)
        q = writer.option("checkpointLocation", os.path.join(self.root, f"chk-{self.runs}")).trigger(availableNow=True).start()
        q.awaitTermination()
        if q.exception() is not None:
            raise RuntimeError(f"{engine}: query failed: {q.exception()}")
        times = [p["durationMs"]["triggerExecution"] / 1000 for p in sorted(q.recentProgress, key=lambda p: p["batchId"])
                 if p["numInputRows"] > 0]
        if wrapper is not None:
            wrapper.settle(q)
            return times, state_name(query_name, "VectorCount", "count")
        if engine in (NATURAL, FOREACH):
            settle(q, address)
            return times, state_name(q, "VectorCount", "count")
        return times, None


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=40, help="micro-batches per stream (default 40)")
    parser.add_argument("--warmup", type=int, default=8, help="first batches of each stream left out (default 8)")
    parser.add_argument("--sizes", default="1000,10000", help="events per batch, comma-separated (default 1000,10000)")
    parser.add_argument("--rounds", type=int, default=1, help="streams per engine and size (default 1)")
    parser.add_argument("--nodes", type=int, default=3, help="rockstate state nodes (default 3)")
    parser.add_argument("--engines", default="native,tws,rockstate,floor",
                        help="substrings of the engines' names, comma-separated, matched case-insensitively "
                             "(default: all; 'rockstate' is both shapes, native runs always)")
    args = parser.parse_args()
    if args.batches <= args.warmup:
        parser.error("--batches must be more than --warmup")
    sizes = [int(s) for s in args.sizes.split(",")]
    wanted = [w.strip().lower().replace("native", "groupby").replace("tws", "transformwithstate") for w in args.engines.split(",")]
    engines = [e for e in ENGINES if e == NATIVE or any(w in e.lower() for w in wanted)]

    root = tempfile.mkdtemp(prefix="rockstate-bench-latency-")
    spark = (
        SparkSession.builder.master("local[2]").appName("rockstate-bench-latency")
        .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    rows = []
    try:
        with rockstate.LocalCluster(nodes=args.nodes, root=os.path.join(root, "cluster")) as cluster, cluster.connect() as rs:
            bench = Bench(spark, cluster, root, rs.backend.table.owners)
            for size in sizes:
                source = os.path.join(root, f"events-{size}")
                expected = write_events(source, size, args.batches, seed=size).tolist()
                samples: dict[str, list[float]] = {e: [] for e in engines}
                for done in range(1, args.rounds + 1):
                    for engine in engines:
                        times, state = bench.stream(source, engine)
                        if len(times) != args.batches:
                            raise RuntimeError(f"{engine}: {len(times)} batches with input, expected {args.batches}")
                        samples[engine] += times[args.warmup:]
                        if state is not None:
                            assert rs.value_state(state).get_many(range(KEYS), default=0) == expected, f"{engine}: wrong counts"
                        print(f"{size:,} events/batch, round {done}: {engine}: p50 {percentile(times[args.warmup:], 50):,.0f} ms",
                              flush=True)
                native = {q: percentile(samples[NATIVE], q) for q in (50, 90)}
                for engine in engines:
                    p50, p90 = percentile(samples[engine], 50), percentile(samples[engine], 90)
                    rows.append([f"{size:,}", engine, len(samples[engine]), p50, p90, p50 / native[50], p90 / native[90]])
            close_clients()
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    print_table(
        f"spark latency: running count over {KEYS:,} keys, {args.batches} micro-batches of one file each (first "
        f"{args.warmup} left out), local[2], noop sink, {args.nodes} state nodes with the default backup "
        "(goal for rockstate: p50 and p90 <= 1.0x native)",
        ["events/batch", "engine", "batches", "p50 ms", "p90 ms", "p50 x native", "p90 x native"],
        rows,
    )


if __name__ == "__main__":
    main()
