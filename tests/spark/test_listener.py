"""The state of a query's last batch visible to an outside reader without settle(), and the query under pipelines.

Spark posts a batch's progress after committing it; the driver's listener
(``rockstate.spark.listener``) then applies the batch. Progress events are
asynchronous: the reader waits, with a timeout, for the exact counts.
"""

import json
import subprocess
import sys

from rockstate.local.runners import wait_until
from rockstate.spark import exactly_once, state_name, transform_with_state

from .test_streaming import FILES, ROWS, SCHEMA, Count, write_files

WAIT = 120  # seconds for the listener to see the last batch's progress (asynchronous; a loaded machine is slow)


def _source(spark, tmp_path):
    return spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(tmp_path / "in"))


def test_a_plain_querys_last_batch_is_visible_without_settle_and_it_shows_under_pipelines(spark, cluster, rs, tmp_path):
    clicks = write_files(tmp_path / "in")
    totals = clicks.groupby("user").size()
    counted = transform_with_state(_source(spark, tmp_path), "user", Count("visible"), "user string, count long", cluster.address)
    query = (counted.writeStream.format("memory").queryName("visible").outputMode("append")
             .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start())
    query.awaitTermination(300)
    assert query.exception() is None
    # another query of the session, without the operator: the listener neither touches nor reports it
    other = (_source(spark, tmp_path).writeStream.format("memory").queryName("plain_copy")
             .option("checkpointLocation", str(tmp_path / "chk-other")).trigger(availableNow=True).start())
    other.awaitTermination(300)
    assert other.exception() is None

    state = rs.value_state(state_name(query, "Count", "visible"))
    wait_until(lambda: state.get_many(totals.index) == totals.tolist(), WAIT, "the last batch's counts without settle()")
    assert state.get_many(totals.index) == totals.tolist()

    def reported():
        return [p for p in cluster.status()["pipelines"] if p["query"] == str(query.id) and p["last_batch"] == FILES - 1]

    record = wait_until(reported, WAIT, "the query's last batch under pipelines")[0]
    assert record["id"] == str(query.id) and record["name"] == "visible"
    assert [b["batch"] for b in record["batches"]][-FILES:] == list(range(FILES))
    assert all(b["rows_in"] == ROWS for b in record["batches"][-FILES:])
    assert str(other.id) not in {p["query"] for p in cluster.status()["pipelines"]}

    shown = subprocess.run([sys.executable, "-m", "rockstate.cli", "status", "--coordinator", cluster.address, "--output", "json"],
                           capture_output=True, text=True, timeout=60)
    listed = {p["query"]: p for p in json.loads(shown.stdout)["pipelines"]}
    assert listed[str(query.id)]["last_batch"] == FILES - 1 and listed[str(query.id)]["name"] == "visible"
    assert str(other.id) not in listed


def test_an_exactly_once_querys_last_batch_is_visible_without_settle(spark, cluster, rs, tmp_path):
    clicks = write_files(tmp_path / "in")
    totals = clicks.groupby("user").size()

    def sink(df, batch_id):
        transform_with_state(df, "user", Count("eo-visible"), "user string, count long", cluster.address).write.format("noop").mode("overwrite").save()

    query = (_source(spark, tmp_path).writeStream.foreachBatch(exactly_once(sink, client=cluster.address, query="eo_visible"))
             .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start())
    query.awaitTermination(300)
    assert query.exception() is None
    state = rs.value_state(state_name("eo_visible", "Count", "eo-visible"))
    wait_until(lambda: state.get_many(totals.index) == totals.tolist(), WAIT, "the last batch's counts without settle()")
    assert state.get_many(totals.index) == totals.tolist()
    # exactly_once reports itself under its own name; the listener adds no record under Spark's id
    assert str(query.id) not in {p["query"] for p in cluster.status()["pipelines"]}
    assert [p["last_batch"] for p in cluster.status()["pipelines"] if p["query"] == "eo_visible"] == [FILES - 1]
