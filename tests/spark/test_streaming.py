"""transform_with_state inside streaming queries: a running count over files, micro-batch by micro-batch."""

import json
import sys

import numpy as np
import pandas as pd
from pyspark import cloudpickle

from rockstate.spark import StatefulProcessor, settle, state_name, transform_with_state

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors cannot import the tests

FILES, ROWS, USERS = 3, 2000, 300
SCHEMA = "user string, clicks bigint"


class Counter(StatefulProcessor):
    def __init__(self, state):
        self.state = state

    def init(self, handle):
        self.counts = handle.value_state(self.state)


class Count(Counter):
    def handle_input_rows(self, key, rows):
        count = self.counts.get(0) + sum(len(r) for r in rows)
        self.counts.update(count)
        yield (key[0], count)  # a row as a tuple


class VectorCount(Counter):
    def handle_batch(self, batch):
        sizes = batch.groupby("user").size()
        counts = np.asarray(self.counts.get_many(sizes.index, default=0)) + sizes.to_numpy()
        self.counts.put_many(sizes.index, counts)
        return pd.DataFrame({"user": sizes.index, "count": counts})


def write_files(directory):
    """FILES JSON files of click events; returns every event as a DataFrame."""
    rng = np.random.default_rng(5)
    directory.mkdir()
    frames = []
    for i in range(FILES):
        frame = pd.DataFrame({"user": [f"u{u}" for u in rng.integers(0, USERS, ROWS)], "clicks": 1})
        with open(directory / f"part-{i}.json", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in frame.to_dict("records"))
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def run_query(spark, tmp_path, name, counted):
    """Each file is one micro-batch (maxFilesPerTrigger=1); every output row goes to a memory table."""
    source = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(tmp_path / "in"))
    query = (counted(source).writeStream.format("memory").queryName(name).outputMode("append")
             .option("checkpointLocation", str(tmp_path / f"chk-{name}")).trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None
    return spark.table(name).toPandas(), query


def test_streaming_running_count_over_files(spark, cluster, rs, tmp_path):
    clicks = write_files(tmp_path / "in")
    expected = clicks.groupby("user").size()
    for name, processor in (("stream_rows", Count("stream-rows")), ("stream_vec", VectorCount("stream-vec"))):
        out, query = run_query(spark, tmp_path, name, lambda df: transform_with_state(df, "user", processor, "user string, count long", cluster.address))
        assert settle(query, cluster.address) == FILES - 1  # the last batch's state, applied now rather than at the next run
        # the last count output for each user is the user's total: counts only grow
        assert out.groupby("user")["count"].max().sort_index().to_dict() == expected.sort_index().to_dict()
        state = rs.value_state(state_name(query, type(processor).__name__, processor.state))
        assert state.get_many(expected.index) == expected.tolist()


def test_foreach_batch_running_count(spark, cluster, rs, tmp_path):
    clicks = write_files(tmp_path / "in")
    seen = []

    def each(batch_df, batch_id):
        out = transform_with_state(batch_df, "user", Count("foreach-count"), "user string, count long", cluster.address)
        seen.append(out.toPandas())  # consumed: the operator runs

    source = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(tmp_path / "in"))
    query = source.writeStream.foreachBatch(each).option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start()
    query.awaitTermination(120)
    assert query.exception() is None and len(seen) == FILES
    out = pd.concat(seen)
    expected = clicks.groupby("user").size()
    assert all(not frame["user"].duplicated().any() for frame in seen)  # one row per key per micro-batch
    assert out.groupby("user")["count"].max().sort_index().to_dict() == expected.sort_index().to_dict()
    settle(query, cluster.address)
    assert rs.value_state(state_name(query, "Count", "foreach-count")).get_many(expected.index) == expected.tolist()
