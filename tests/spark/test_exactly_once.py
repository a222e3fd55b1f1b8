"""Exactly-once micro-batches on real Spark and a real cluster: task retries, driver restarts, a state node killed."""

import json
import os
import sys

import numpy as np
import pandas as pd
import pytest
from pyspark import TaskContext, cloudpickle
from pyspark.errors import StreamingQueryException

from rockstate import LocalCluster
from rockstate.errors import ConfigError
from rockstate.spark import ExactlyOnce, ParquetSink, StatefulProcessor, StateClientSpec, exactly_once, transform_with_state

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors cannot import the tests

FILES, ROWS, USERS = 4, 1500, 200
SCHEMA = "user string, file long"
OUT = "user string, file long, count long"


class FlakyCount(StatefulProcessor):
    """A running count per user; with ``fail_batch_of_file``, the first attempt of each task fails midway on that file."""

    def __init__(self, state, fail_file=None):
        self.state, self.fail_file = state, fail_file

    def init(self, handle):
        self.counts = handle.value_state(self.state)
        self.chunks = 0

    def handle_batch(self, batch):
        sizes = batch.groupby("user").size()
        counts = np.asarray(self.counts.get_many(sizes.index, default=0)) + sizes.to_numpy()
        self.counts.put_many(sizes.index, counts)
        self.chunks += 1
        context = TaskContext.get()
        if self.fail_file is not None and batch["file"].iloc[0] == self.fail_file and context.attemptNumber() == 0 and self.chunks > 1:
            raise RuntimeError("injected failure after staging part of the task's writes")
        return pd.DataFrame({"user": sizes.index, "file": batch["file"].iloc[0], "count": counts})


def write_files(directory):
    """One JSON file per micro-batch (modification times in order); every event as a DataFrame."""
    rng = np.random.default_rng(11)
    directory.mkdir()
    frames = []
    for i in range(FILES):
        frame = pd.DataFrame({"user": [f"u{u}" for u in rng.integers(0, USERS, ROWS)], "file": i})
        path = directory / f"part-{i}.json"
        with open(path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in frame.to_dict("records"))
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def expected_output(events):
    """Per (file, user) in the file: the user's count over files up to it."""
    per_file = events.groupby(["file", "user"]).size().rename("n").reset_index().sort_values(["user", "file"])
    per_file["count"] = per_file.groupby("user")["n"].cumsum()
    return per_file[["user", "file", "count"]].sort_values(["file", "user"]).reset_index(drop=True)


def run(spark, tmp_path, wrapper, name="q"):
    source = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(tmp_path / "in"))
    query = (source.writeStream.foreachBatch(wrapper).option("checkpointLocation", str(tmp_path / f"chk-{name}"))
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination(300)
    except StreamingQueryException as e:
        return e
    if query.exception() is None:
        wrapper.settle(query)  # the last batch's state, applied now rather than at the next run
    return query.exception()


def sink_for(client, state, out_dir, fail_file=None, tasks=2):
    parquet = ParquetSink(str(out_dir))

    def sink(df, batch_id):
        out = transform_with_state(df, "user", FlakyCount(state, fail_file), OUT, client, tasks=tasks, max_batch_bytes=4096)
        parquet(out, batch_id)

    return sink


def read_output(spark, out_dir):
    got = spark.read.parquet(str(out_dir)).toPandas()
    return got[["user", "file", "count"]].sort_values(["file", "user"]).reset_index(drop=True)


def test_a_task_failing_on_its_first_attempt_gives_exact_counts(spark, cluster, rs, tmp_path):
    events = write_files(tmp_path / "in")
    wrapper = exactly_once(sink_for(cluster.address, "eo-flaky", tmp_path / "out", fail_file=1), client=cluster.address, query="flaky")
    assert run(spark, tmp_path, wrapper) is None
    pd.testing.assert_frame_equal(read_output(spark, tmp_path / "out"), expected_output(events), check_dtype=False)
    totals = events.groupby("user").size()
    assert rs.value_state("flaky.FlakyCount.eo-flaky").get_many(totals.index) == totals.tolist()
    status = cluster.status()
    assert [p["last_batch"] for p in status["pipelines"] if p["query"] == "flaky"] == [FILES - 1]
    last = [p for p in status["pipelines"] if p["query"] == "flaky"][0]["batches"][-1]
    assert last["rows_in"] == ROWS and last["rows_out"] == events[events.file == FILES - 1]["user"].nunique()


class DiesAfterCommit(ExactlyOnce):
    """The driver 'dies' after sealing the batch's state and taking the checkpoint, before Spark commits the batch."""

    def __call__(self, df, batch_id):
        super().__call__(df, batch_id)
        if batch_id == 2:
            raise RuntimeError("driver died before Spark committed the batch")


def test_a_driver_restart_repeats_nothing(spark, cluster, rs, tmp_path):
    events = write_files(tmp_path / "in")
    sink = sink_for(cluster.address, "eo-restart", tmp_path / "out")
    assert run(spark, tmp_path, DiesAfterCommit(sink, cluster.address, "restart")) is not None  # the query failed
    assert run(spark, tmp_path, exactly_once(sink, client=cluster.address, query="restart")) is None  # restarted
    pd.testing.assert_frame_equal(read_output(spark, tmp_path / "out"), expected_output(events), check_dtype=False)
    totals = events.groupby("user").size()
    assert rs.value_state("restart.FlakyCount.eo-restart").get_many(totals.index) == totals.tolist()


@pytest.fixture(params=[0, 1], ids=["no backups", "one backup"])
def durable_cluster(request, tmp_path):
    """Without backups a dead node's partitions come back from the latest checkpoint (the batch rewinds);
    with one synchronous backup they are promoted with nothing lost."""
    with LocalCluster(nodes=3, partitions=6, root=str(tmp_path / "cluster"), checkpoints=f"file://{tmp_path}/chk-store",
                      heartbeat_timeout=2.0, backup_count=request.param) as c:
        yield c


def test_a_state_node_killed_mid_query_gives_exact_output(spark, durable_cluster, tmp_path):
    events = write_files(tmp_path / "in")
    client = StateClientSpec(durable_cluster.address, retry_timeout=60.0)
    inner = sink_for(client, "eo-durable", tmp_path / "out")
    killed = []

    def sink(df, batch_id):
        inner(df, batch_id)  # this batch's writes are staged, on every node
        if batch_id == 2 and not killed:
            victim = durable_cluster.nodes()[0]
            durable_cluster.kill_node(victim.node_id)  # SIGKILL, before the batch commits
            killed.append(victim.node_id)

    assert run(spark, tmp_path, exactly_once(sink, client=client, query="durable", checkpoint_every=2)) is None
    assert killed
    events_seen = durable_cluster.status()["events"]
    taken_over = [e for e in events_seen if e["event"] in ("partition_restored", "primary_promoted")]
    assert taken_over and all(e["previous"] == killed[0] for e in taken_over)
    status = durable_cluster.status()
    expected = "primary_promoted" if status["backup_count"] else "partition_restored"
    assert {e["event"] for e in taken_over} == {expected}
    # with backups only every second batch is checkpointed (checkpoint_every=2); without, every one (the record of
    # the batch before the kill may be gone: the bookkeeping is state too, restored to the checkpoint before it)
    record = next(r for r in status["pipelines"] if r["query"] == "durable")
    checkpointed = {b["batch"]: b["checkpoint"] is not None for b in record["batches"]}
    if status["backup_count"]:
        assert checkpointed == {0: True, 1: False, 2: True, 3: False}, record
    else:
        assert all(checkpointed.values()) and {0, FILES - 1} <= set(checkpointed), record
    pd.testing.assert_frame_equal(read_output(spark, tmp_path / "out"), expected_output(events), check_dtype=False)
    totals = events.groupby("user").size()
    with durable_cluster.connect() as rs:
        assert rs.value_state("durable.FlakyCount.eo-durable").get_many(totals.index) == totals.tolist()


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_checkpoint_every_must_be_a_count_of_micro_batches(bad):
    with pytest.raises(ConfigError, match="checkpoint_every"):
        exactly_once(print, client="127.0.0.1:7700", query="q", checkpoint_every=bad)
