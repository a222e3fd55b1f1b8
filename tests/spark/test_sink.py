"""``writeStream.format("rockstate")``: rows into a state, each micro-batch exactly once, on real Spark and a real cluster."""

import datetime as dt
import json
import os
import sys
import threading
from decimal import Decimal

import pandas as pd
import pytest
from pyspark import TaskContext, cloudpickle
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F
from pyspark.sql import types as T

from rockstate import LocalCluster
from rockstate.errors import ConfigError, InvalidInputError
from rockstate.spark import SPARK_VERSION, StateClientSpec, register_data_source

if SPARK_VERSION < (4, 0):
    pytest.skip("the Python Data Source API is Spark 4.0+", allow_module_level=True)

from rockstate.spark.sink import SinkOptions  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors cannot import the tests

FILES, ORDERS = 4, 3000
SCHEMA = "region string, id long, amount decimal(12,2), at timestamp, op string"
UTC = dt.timezone.utc


def write_changes(directory, files=FILES):
    """Change events of orders, one JSON file per micro-batch: upserts, and from the second file on some deletes."""
    directory.mkdir(exist_ok=True)
    rows = []
    for f in range(files):
        with open(directory / f"part-{f}.json", "w") as out:
            for i in range(ORDERS):
                if (i + f) % 3 == 0:
                    continue  # not every order changes in every batch
                row = {"region": ("eu", "us", "apac")[i % 3], "id": i, "amount": f"{i}.{f:02d}",
                       "at": f"2026-11-{f + 1:02d}T10:00:{i % 60:02d}Z", "op": "delete" if f and i % 7 == f else "upsert"}
                out.write(json.dumps(row) + "\n")
                rows.append({**row, "file": f})
        os.utime(directory / f"part-{f}.json", (1_700_000_000 + f, 1_700_000_000 + f))
    return pd.DataFrame(rows)


def expected_state(changes):
    """Per (region, id): the last change's value, or nothing after a delete."""
    last = changes.sort_values("file").groupby(["region", "id"]).last()
    last = last[last["op"] == "upsert"]
    return {key: {"amount": Decimal(r["amount"]), "at": dt.datetime.fromisoformat(r["at"].replace("Z", "+00:00"))}
            for key, r in last.iterrows()}


def as_values(source, value=None):
    return source.select("region", "id", (value if value is not None else F.when(F.col("op") == "delete", F.lit(None))
                                          .otherwise(F.struct("amount", "at"))).alias("value"))


def start(spark, tmp_path, df, address, state, name="q", **options):
    writer = (df.writeStream.format("rockstate").option("address", address).option("state", state).option("key", "region,id")
              .option("checkpointLocation", str(tmp_path / f"chk-{name}")).trigger(availableNow=True))
    for k, v in options.items():
        writer = writer.option(k, v)
    return writer.start()


def finish(query, timeout=180):
    try:
        query.awaitTermination(timeout)
    except StreamingQueryException as e:
        return e
    return query.exception()


def read_state(rs, state, keys):
    got = rs.value_state(state).get_many(keys)
    return {k: {"amount": v["amount"], "at": v["at"].astimezone(UTC)} for k, v in zip(keys, got) if v is not None}


def source(spark, directory):
    return spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(directory))


@pytest.fixture(autouse=True)
def registered(spark):
    register_data_source(spark)


def test_each_micro_batch_lands_whole_keys_as_tuples_decimals_and_timestamps_deletes_by_null(spark, cluster, rs, tmp_path):
    changes = write_changes(tmp_path / "in")
    query = start(spark, tmp_path, as_values(source(spark, tmp_path / "in")), cluster.address, "orders")
    assert finish(query) is None
    assert [p["batchId"] for p in query.recentProgress] == list(range(FILES))
    expected = expected_state(changes)
    keys = sorted({(r.region, r.id) for r in changes.itertuples()})
    assert read_state(rs, "orders", keys) == expected  # committed batches are applied at once: no settle needed
    assert rs.value_state("orders").count() == len(expected)


def test_a_batch_spark_runs_again_after_its_commit_writes_nothing(spark, cluster, rs, tmp_path):
    """The driver dying between the sink's commit and Spark's commit log: Spark runs the batch again on restart."""
    changes = write_changes(tmp_path / "in", files=2)
    query = start(spark, tmp_path, as_values(source(spark, tmp_path / "in")), cluster.address, "rerun", name="rerun")
    assert finish(query) is None
    for name in ("1", ".1.crc"):  # as if the driver died before logging batch 1's commit
        os.remove(tmp_path / "chk-rerun" / "commits" / name)
    with open(tmp_path / "in" / "part-1.json") as f:  # the same file, other contents: a re-applied batch would show them
        rows = [json.loads(line) for line in f]
    with open(tmp_path / "in" / "part-1.json", "w") as f:
        f.writelines(json.dumps({**r, "amount": "0.01", "op": "upsert"}) + "\n" for r in rows)
    again = start(spark, tmp_path, as_values(source(spark, tmp_path / "in")), cluster.address, "rerun", name="rerun")
    assert finish(again) is None
    assert [p["batchId"] for p in again.recentProgress] == [1]  # Spark did run batch 1 again
    keys = sorted({(r.region, r.id) for r in changes.itertuples()})
    assert read_state(rs, "rerun", keys) == expected_state(changes)


_calls = {}  # (stage, partition) -> Arrow batches the UDF saw in the task's first attempt


def test_a_failed_task_attempts_writes_are_never_applied(spark, cluster, rs, tmp_path):
    """Each write task's first attempt stages two Arrow batches of rows under keys of their own, then fails in the
    sink on a value over the cluster's size limit; the retry's rows are the batch."""
    changes = write_changes(tmp_path / "in", files=2)

    @F.pandas_udf("string")
    def flaky(op: pd.Series) -> pd.Series:
        context = TaskContext.get()
        if context.attemptNumber() > 0:
            return op
        task = (context.stageId(), context.partitionId())
        _calls[task] = _calls.get(task, 0) + 1
        return pd.Series(["wrong"] * len(op) if _calls[task] <= 2 else ["huge"] + ["wrong"] * (len(op) - 1))

    df = source(spark, tmp_path / "in").repartition(2).withColumn("op", flaky("op"))  # the UDF runs in the write tasks
    # the first attempts' rows go to keys of their own (negative ids), which the retries never write over
    df = df.withColumn("id", F.when(F.col("op") == "wrong", -1 - F.col("id")).otherwise(F.col("id")))
    too_big = F.struct(F.repeat(F.lit("x"), 17 * 2**20).alias("amount"), F.col("at"))  # > max_value_bytes (16 MiB)
    value = F.when(F.col("op") == "delete", F.lit(None)).when(F.col("op") == "huge", too_big).otherwise(
        F.struct(F.col("amount").cast("string").alias("amount"), "at"))
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "200")  # several Arrow batches, staged one by one
    try:
        query = start(spark, tmp_path, as_values(df, value), cluster.address, "flaky", name="flaky")
        assert finish(query) is None
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "1000")
    keys = sorted({(r.region, r.id) for r in changes.itertuples()})
    got = {k: {"amount": Decimal(v["amount"]), "at": v["at"]} for k, v in read_state(rs, "flaky", keys).items()}
    assert got == expected_state(changes)
    assert not [k for k in rs.value_state("flaky").keys() if k[1] < 0]  # nothing of a failed attempt


def test_a_state_node_killed_mid_stream_loses_nothing(spark, tmp_path):
    changes = write_changes(tmp_path / "in", files=6)
    with LocalCluster(nodes=3, partitions=8, root=str(tmp_path / "cluster"), heartbeat_timeout=2.0) as cluster:
        client = cluster.connect()
        query = start(spark, tmp_path, as_values(source(spark, tmp_path / "in")), cluster.address, "durable", name="durable")
        killed = []

        def kill_after_batch_one():
            progress = threading.Event()
            while not progress.wait(0.05) and query.isActive:
                if any(p["batchId"] >= 1 for p in query.recentProgress):
                    victim = cluster.nodes()[0].node_id
                    cluster.kill_node(victim)  # SIGKILL while later batches stage and commit
                    killed.append(victim)
                    return

        killer = threading.Thread(target=kill_after_batch_one)
        killer.start()
        try:
            assert finish(query, 300) is None
        finally:
            killer.join()
        assert killed, "the stream ended before a node was killed"
        assert any(e["event"] == "primary_promoted" and e["previous"] == killed[0] for e in cluster.status()["events"])
        keys = sorted({(r.region, r.id) for r in changes.itertuples()})
        assert read_state(client, "durable", keys) == expected_state(changes)
        client.close()


def test_a_ttl_state_or_a_missing_column_is_refused_when_the_query_starts(spark, cluster, rs, tmp_path):
    write_changes(tmp_path / "in", files=1)
    rs.value_state("expiring", ttl=60).put("k", 1)
    for state, df, why in (("expiring", as_values(source(spark, tmp_path / "in")), "the rockstate sink writes value states without TTL"),
                           ("fine", source(spark, tmp_path / "in"), "column 'value' is not in the stream")):
        try:
            query = start(spark, tmp_path, df, cluster.address, state, name=state)
            error = finish(query)
        except Exception as e:  # the planner's error surfaces at start() or as the query's exception
            error = e
        assert error is not None and why in str(error), (state, error)


def test_a_batch_write_is_refused_naming_the_stream_and_bulk_load(spark, cluster, tmp_path):
    df = spark.createDataFrame([("a", 1)], "key string, value long")
    with pytest.raises(Exception, match="writes streams"):
        df.write.format("rockstate").option("address", cluster.address).option("state", "batch").mode("append").save()


SCHEMA_T = T.StructType([T.StructField("k", T.StringType()), T.StructField("v", T.LongType())])


@pytest.mark.parametrize("options, error, why", [
    ({"state": "s", "key": "k", "value": "v"}, ConfigError, '"address"'),
    ({"address": "127.0.0.1:1", "key": "k", "value": "v"}, ConfigError, '"state"'),
    ({"address": "127.0.0.1:1", "state": "s"}, InvalidInputError, "column 'key' is not in the stream"),
    ({"address": "127.0.0.1:1", "state": "s", "key": "k", "value": "k"}, InvalidInputError, "must differ"),
    ({"address": "nowhere", "state": "s", "key": "k", "value": "v"}, Exception, "host:port"),
])
def test_the_sinks_options_are_checked(options, error, why):
    with pytest.raises(error, match=why):
        SinkOptions.parse(options, SCHEMA_T)


def test_a_secret_file_reaches_the_spec(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    parsed = SinkOptions.parse({"Address": "127.0.0.1:7400", "State": "s", "key": "k", "value": "v", "secret_file": str(secret)}, SCHEMA_T)
    assert parsed.spec == StateClientSpec("127.0.0.1:7400", secret=b"s3cret") and parsed.keys == ("k",)
