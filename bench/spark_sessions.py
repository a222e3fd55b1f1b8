"""Session windows closed by processing-time timers: rockstate vs Spark's transformWithStateInPandas, on local[2].

Each key's session counts its events; every batch a key has events, its
timer is moved to the batch's processing time plus the gap; when the timer
fires, the session is emitted (key, events) and its state deleted. The events
(BENCH_SESSION_EVENTS over BENCH_SESSION_KEYS string ids) are written once
as Parquet files and read as a file stream of BENCH_SESSION_BATCHES
micro-batches; key k has its events in batch k mod BATCHES only, so every
session closes in the batch after its events (the last batch's stay open).
The gap is BENCH_SESSION_GAP_MS (default 1 ms): a 30 s gap in processing time
would need 30 s between batches for any timer to fire, and the gap's value
does not change the work, only when it happens. Engines, each from empty
state, into the ``noop`` sink:

- rockstate, vectorized: ``handle_batch`` + ``handle_expired_timers``
  (``get_many``/``put_many`` and ``register_timers``/``delete_timers`` per batch);
- rockstate, per key: the transformWithStateInPandas processor renamed;
- Spark ``transformWithStateInPandas`` (RocksDB state store), timeMode ProcessingTime;
- the floor: the same stream shuffled by key into one ``mapInArrow`` pass that
  keeps no state and emits nothing -- what Spark's micro-batches, a shuffle and
  a Python pass cost before any state is touched. Its "x TWS" is the most any
  stateful engine built on them could reach here.

Then the vectorized engine alone on the same sessions keyed by ints, UUID
strings and (tenant string, int) tuples (goal: each within 1.2x of ints). And
the timer's own cost, in one process against the same cluster, per key kind:
N timers registered and fired through the operator's handle and timer view
(fire = find the expired ones in the index by time, delete them) against N
value-state writes of the same keys (goal: firing <= 2x a write per timer).
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql.streaming import StatefulProcessor as SparkProcessor  # noqa: E402
from pyspark.sql.streaming import StreamingQueryListener  # noqa: E402

import rockstate  # noqa: E402
from common import key_of, print_table  # noqa: E402
from rockstate.spark import StatefulProcessor, close_clients, settle, transform_with_state  # noqa: E402
from rockstate.spark.batch import Batch, BatchWriter  # noqa: E402
from rockstate.spark.processor import StatefulProcessorHandle  # noqa: E402

EVENTS = int(os.environ.get("BENCH_SESSION_EVENTS", 1_000_000))  # the workload: 1M events, 100k keys
KEYS = int(os.environ.get("BENCH_SESSION_KEYS", 100_000))
BATCHES = int(os.environ.get("BENCH_SESSION_BATCHES", 4))
GAP_MS = int(os.environ.get("BENCH_SESSION_GAP_MS", 1))
TIMERS = int(os.environ.get("BENCH_TIMERS", 100_000))
RUNS = int(os.environ.get("BENCH_SESSION_RUNS", 3))
ENGINES = os.environ.get("BENCH_SESSION_ENGINES", "vectorized,per key,Spark,floor")  # substrings of the engines' names to run
OUTPUT = "key string, events long"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
FLOOR = "floor: shuffle + mapInArrow, no state"


def _nothing(batches):
    for _ in batches:
        pass
    return iter(())


class VectorSessions(StatefulProcessor):
    def __init__(self, keys: list[str] = ("key",)) -> None:
        self.keys = list(keys)  # one column, or a (tenant, key) tuple of two

    def init(self, handle):
        self.handle = handle
        self.sessions = handle.value_state("sessions")  # [events, timer ms]

    def handle_batch(self, batch):
        sizes = batch.groupby(self.keys[0] if len(self.keys) == 1 else self.keys).size()
        now = self.handle.now_ms()
        old = self.sessions.get_many(sizes.index)
        had = [i for i, s in enumerate(old) if s is not None]
        if had:
            self.handle.delete_timers(sizes.index[had], [old[i][1] for i in had])
        counts = [(0 if s is None else s[0]) + int(n) for s, n in zip(old, sizes.to_numpy())]
        self.sessions.put_many(sizes.index, [[c, now + GAP_MS] for c in counts])
        self.handle.register_timers(sizes.index, np.full(len(sizes), now + GAP_MS))

    def handle_expired_timers(self, timers, timer_values):
        keys = timers[self.keys[0]] if len(self.keys) == 1 else timers[self.keys]
        found = self.sessions.get_many(keys)
        self.sessions.delete_many(keys)
        return timers[self.keys].assign(events=[s[0] for s in found])


class SparkSessions(SparkProcessor):
    def init(self, handle):
        self.handle = handle
        self.events = handle.getValueState("events", "n long")

    def handleInputRows(self, key, rows, timerValues):
        for t in self.handle.listTimers():
            self.handle.deleteTimer(t)
        n = (self.events.get()[0] if self.events.exists() else 0) + sum(len(pdf) for pdf in rows)
        self.events.update((n,))
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + GAP_MS)
        return iter([])

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        n = self.events.get()[0]
        self.events.clear()
        yield pd.DataFrame({"key": key, "events": [n]})


class KeySessions(StatefulProcessor):  # SparkSessions with rockstate's names: the port
    def init(self, handle):
        self.handle = handle
        self.events = handle.get_value_state("events", "n long")

    def handle_input_rows(self, key, rows, timer_values):
        for t in self.handle.list_timers():
            self.handle.delete_timer(t)
        n = (self.events.get()[0] if self.events.exists() else 0) + sum(len(pdf) for pdf in rows)
        self.events.update((n,))
        self.handle.register_timer(timer_values.get_current_processing_time_in_ms() + GAP_MS)
        return iter([])

    def handle_expired_timer(self, key, timer_values, expired_timer_info):
        n = self.events.get()[0]
        self.events.clear()
        yield pd.DataFrame({"key": key, "events": [n]})


KINDS = {  # key kind: (key columns, their schema); the main table's string ids are "user-00000042"
    "int": (["key"], "key long"),
    "uuid": (["key"], "key string"),
    "tuple": (["tenant", "key"], "tenant string, key long"),
}


def key_list(kind: str, n: int) -> list:
    """The first ``n`` keys of ``kind``: "ids" (strings "user-00000042") or one of KINDS."""
    return [f"user-{k:08d}" for k in range(n)] if kind == "ids" else [key_of(kind, k) for k in range(n)]


def write_events(directory: str, kind: str = "ids") -> dict:
    """BATCHES Parquet files; returns the events per key of the sessions that close (all but the last batch's),
    {key: events} (a (tenant, key) tuple for tuples). ``kind``: "ids" (strings "user-00000042") or one
    of KINDS."""
    rng = np.random.default_rng(7)
    keys = rng.integers(0, KEYS, EVENTS)
    every = key_list(kind, KEYS)
    if kind == "tuple":
        columns = {"tenant": np.array([tenant for tenant, _ in every], dtype=object), "key": np.arange(KEYS)}
    else:
        columns = {"key": np.array(every, dtype=np.int64 if kind == "int" else object)}
    os.makedirs(directory)
    for b in range(BATCHES):
        mine = keys[keys % BATCHES == b]
        path = os.path.join(directory, f"part-{b:03d}.parquet")
        pq.write_table(pa.table({name: column[mine] for name, column in columns.items()}), path)
        os.utime(path, (1000 + b, 1000 + b))
    closed = keys[keys % BATCHES != BATCHES - 1]
    counts = pd.DataFrame({name: column[closed] for name, column in columns.items()}).value_counts()
    return {k if len(columns) > 1 else k[0]: int(n) for k, n in counts.items()}


def sessions_of(out: pd.DataFrame, keys: list[str]) -> dict:
    """A query's output as {key: events}, as ``write_events`` answers."""
    return out.set_index(keys[0] if len(keys) == 1 else keys)["events"].to_dict()


class InputDone(StreamingQueryListener):
    """Ids of the queries that ran their last input batch (or ended). Asking a query's ``lastProgress`` 20 times a
    second instead took a fifth of a core of this 2-core machine away from the engines (py4j converts it whole)."""

    def __init__(self) -> None:
        self.done: set[str] = set()

    def onQueryStarted(self, event) -> None:
        pass

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryProgress(self, event) -> None:
        if event.progress.batchId >= BATCHES - 1:
            self.done.add(str(event.progress.id))

    def onQueryTerminated(self, event) -> None:
        self.done.add(str(event.id))


def stream(spark, source: str, root: str, name: str, build, listener: InputDone,
           schema: str = "key string") -> tuple[float, pd.DataFrame, object]:
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    df = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(source)
    start = time.perf_counter()
    q = (build(df).writeStream.format("memory").queryName(name).outputMode("append")
         .option("checkpointLocation", os.path.join(root, f"chk-{name}")).trigger(availableNow=True).start())
    # transformWithStateInPandas in processing time runs no-data batches for ever after the input: time the input's
    while q.isActive and str(q.id) not in listener.done:
        time.sleep(0.05)
    elapsed = time.perf_counter() - start
    q.stop()
    if q.exception() is not None:
        raise RuntimeError(f"{name} failed: {q.exception()}")
    return elapsed, spark.table(name).toPandas(), q


def timer_cost(rs, kind: str = "ids") -> tuple[float, float]:
    """Per key: (a value-state write, a timer fired), each a batch of TIMERS keys of ``kind`` through the operator's
    handle."""
    handle = StatefulProcessorHandle(rs.backend, f"bench-timers-{kind}", time_mode="processingtime")
    keys = (pd.MultiIndex.from_tuples if kind == "tuple" else pd.Index)(key_list(kind, TIMERS))
    state = handle.value_state("written")

    def in_batch(work) -> float:
        batch = Batch(rs.backend, BatchWriter(rs.backend))
        handle.begin(batch)
        start = time.perf_counter()
        work(batch)
        handle.finish()
        return time.perf_counter() - start

    writes, fires = [], []
    for _ in range(3):
        writes.append(in_batch(lambda b: state.put_many(keys, np.arange(TIMERS))))
        in_batch(lambda b: handle.register_timers(keys, np.arange(TIMERS)))

        def fire(batch):
            view = batch.view(handle.timer_state, "timers")
            expired = view.expired(range(rs.backend.partitions), TIMERS)
            assert len(expired) == TIMERS
            view.fire(expired, TIMERS)

        fires.append(in_batch(fire))
    return statistics.median(writes) / TIMERS, statistics.median(fires) / TIMERS


def by_kind(spark, cluster, root: str, listener: InputDone) -> list[list]:
    """The vectorized engine on ints, UUID strings and (tenant, int) tuples: every run's sessions checked."""
    times = {}
    for kind, (keys, schema) in KINDS.items():
        source = os.path.join(root, f"events-{kind}")
        closed = write_events(source, kind)
        output = f"{schema}, events long"
        times[kind] = []
        for run in range(RUNS):
            elapsed, out, q = stream(spark, source, root, f"k{kind}{run}", lambda df: transform_with_state(
                df, keys, VectorSessions(keys), output, cluster.address, time_mode="processingtime"), listener, schema)
            assert sessions_of(out, keys) == closed, f"{kind}: sessions differ"
            settle(q, cluster.address)
            times[kind].append(elapsed)
    int_s = statistics.median(times["int"])
    return [[kind, f"{statistics.median(runs):.2f}", " ".join(f"{t:.1f}" for t in runs),
             f"{EVENTS / statistics.median(runs) / 1000:.1f}", f"{statistics.median(runs) / int_s:.2f}"] for kind, runs in times.items()]


def main() -> None:
    root = tempfile.mkdtemp(prefix="bench-sessions-")
    spark = (SparkSession.builder.master("local[2]").appName("bench-sessions").config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1").config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    closed = write_events(os.path.join(root, "events"))
    listener = InputDone()
    spark.streams.addListener(listener)
    rows = []
    try:
        with rockstate.LocalCluster(nodes=2, partitions=16, root=os.path.join(root, "cluster")) as cluster:
            engines = [
                ("rockstate, vectorized (handle_batch)", lambda df: transform_with_state(
                    df, "key", VectorSessions(), OUTPUT, cluster.address, time_mode="processingtime")),
                ("rockstate, per key (the TWS processor renamed)", lambda df: transform_with_state(
                    df, "key", KeySessions(), OUTPUT, cluster.address, time_mode="processingtime")),
                ("Spark transformWithStateInPandas, RocksDB", lambda df: df.groupBy("key").transformWithStateInPandas(
                    SparkSessions(), OUTPUT, "Update", "ProcessingTime")),
                (FLOOR, lambda df: df.repartition(2, "key").mapInArrow(_nothing, OUTPUT)),
            ]
            engines = [e for e in engines if any(part in e[0] for part in ENGINES.split(","))]
            times: dict[str, list[float]] = {name: [] for name, _ in engines}
            for run in range(RUNS):  # the engines in turn, so the machine's load and the JVM's warm-up spread over all
                for i, (name, build) in enumerate(engines):
                    elapsed, out, q = stream(spark, os.path.join(root, "events"), root, f"s{run}_{i}", build, listener)
                    got = sessions_of(out, ["key"])
                    expected = {} if name == FLOOR else closed
                    # Spark's no-data batches (before it was stopped) may close the last batch's sessions too
                    assert got == expected or (name.startswith("Spark") and expected.items() <= got.items()), f"{name}: sessions differ"
                    if name.startswith("rockstate"):
                        settle(q, cluster.address)
                    times[name].append(elapsed)
            spark_name = next((name for name, _ in engines if name.startswith("Spark")), None)
            tws = statistics.median(times[spark_name]) if spark_name else float("nan")
            for name, runs in times.items():
                elapsed = statistics.median(runs)
                rows.append([name, f"{elapsed:.2f}", " ".join(f"{t:.1f}" for t in runs), f"{EVENTS / elapsed / 1000:.1f}", f"{tws / elapsed:.2f}"])
            print_table(f"spark sessions: {EVENTS:,} events over {KEYS:,} keys, {BATCHES} micro-batches, processing-time timers "
                        f"(gap {GAP_MS} ms), {len(closed):,} sessions closed, local[2], median of {RUNS} runs each, engines in turn "
                        "(goal: rockstate >= 10x TWS)",
                        ["engine", "s", "runs (s)", "k events/s", "x TWS-in-pandas"], rows)
            print_table(f"the vectorized engine by key kind: the same sessions, median of {RUNS} runs each (cost x int: goal <= 1.2)",
                        ["keys", "s", "runs (s)", "k events/s", "cost x int"], by_kind(spark, cluster, root, listener))
            with cluster.connect() as rs:
                costs = {kind: timer_cost(rs, kind) for kind in ("ids", *KINDS)}
            print_table(f"timer cost, {TIMERS:,} keys per batch, median of 3 (goal: a fired timer <= 2x a state write)",
                        ["keys", "value-state write us", "timer fired us (found by time, deleted)", "x state write"],
                        [[kind, f"{write * 1e6:.2f}", f"{fire * 1e6:.2f}", f"{fire / write:.2f}"] for kind, (write, fire) in costs.items()])
            close_clients()
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
