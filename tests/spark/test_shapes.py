"""Exactly once in every shape a user writes the operator in, through a task failure, a state node killed
mid-batch and a driver dying between the state's commit and Spark's: output and state equal a fault-free run.

The shapes: the operator built on the streaming DataFrame with a plain file sink; on the streaming DataFrame
then ``foreachBatch``; inside ``foreachBatch``; inside ``foreachBatch`` wrapped in ``exactly_once``. The
processor keeps value, list and map state. The faults come from inside the query, where a user's would:
the processor fails its task's first attempt (batch 1) and SIGKILLs a state node (batch 2); after the
operator's tasks are done, a later step fails the batch (batch 3), so the query stops before Spark commits
it — as if the driver died there. A stopped query is started again, as a supervisor would.
"""

import json
import os
import signal
import sys
import warnings

import numpy as np
import pandas as pd
import pytest
from pyspark import TaskContext, cloudpickle
from pyspark.errors import StreamingQueryException

from rockstate import LocalCluster
from rockstate.spark import (ParquetSink, StatefulProcessor, StateClientSpec, WeakerGuaranteeWarning, exactly_once, settle,
                             state_name, transform_with_state)
from rockstate.spark.microbatch import BATCH_ID

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors cannot import the tests

FILES, ROWS, USERS = 5, 400, 60
SCHEMA = "user string, file long, kind string"
OUT = "user string, file long, count long, files string, kinds string"


def write_files(directory):
    rng = np.random.default_rng(3)
    directory.mkdir()
    frames = []
    for i in range(FILES):
        frame = pd.DataFrame({"user": [f"user-{u:03d}" for u in rng.integers(0, USERS, ROWS)], "file": i,
                              "kind": rng.choice(["view", "cart", "buy"], ROWS)})
        path = directory / f"part-{i}.json"
        frame.to_json(path, orient="records", lines=True)
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))  # one file per micro-batch, in order
        frames.append(frame)
    return frames


class Faults:
    """What the processor does to its own query; each fault happens once (a marker file), on a first attempt."""

    def __init__(self, directory, victim_pid=None):
        self.directory, self.victim_pid = str(directory), victim_pid

    def once(self, name):
        try:
            os.close(os.open(os.path.join(self.directory, name), os.O_CREAT | os.O_EXCL))
            return True
        except FileExistsError:
            return False

    def during(self, keys_done):
        context = TaskContext.get()
        batch = int(context.getLocalProperty(BATCH_ID))
        if keys_done != 5 or context.partitionId() != 0 or context.attemptNumber() != 0:
            return
        if batch == 1 and self.once("failed-task"):
            raise RuntimeError("injected: the task's first attempt fails midway")
        if batch == 2 and self.victim_pid and self.once("killed-node"):
            os.kill(self.victim_pid, signal.SIGKILL)


class Profile(StatefulProcessor):
    """Per user: a running count (value), the files seen (list) and a count per kind (map)."""

    def __init__(self, faults=None):
        self.faults = faults

    def init(self, handle):
        self.count = handle.value_state("count")
        self.files = handle.list_state("files")
        self.kinds = handle.map_state("kinds")
        self.keys_done = 0

    def handle_input_rows(self, key, rows):
        rows = pd.concat(list(rows))
        count = self.count.get(0) + len(rows)
        self.count.update(count)
        self.files.append_value(int(rows["file"].iloc[0]))
        for kind, n in rows["kind"].value_counts().items():
            self.kinds.update_value(kind, self.kinds.get_value(kind, 0) + int(n))
        self.keys_done += 1
        if self.faults:
            self.faults.during(self.keys_done)
        yield (key[0], int(rows["file"].iloc[0]), count, json.dumps(list(self.files.get())), json.dumps(dict(self.kinds.iterator())))


def reference(frames):
    """The fault-free answer, computed directly: output rows per batch, and the final state."""
    count, files, kinds, out = {}, {}, {}, []
    for i, frame in enumerate(frames):
        for user, rows in frame.groupby("user", sort=True):
            count[user] = count.get(user, 0) + len(rows)
            files[user] = files.get(user, []) + [i]
            mine = kinds.setdefault(user, {})
            for kind, n in rows["kind"].value_counts().items():
                mine[kind] = mine.get(kind, 0) + int(n)
            out.append((user, i, count[user], json.dumps(files[user]), json.dumps(dict(sorted(mine.items())))))
    return pd.DataFrame(out, columns=OUT.replace(",", "").split()[::2]), count, files, kinds


class DiesBeforeSparkCommits:
    """Fails batch 3 after the operator's tasks are done, until ``disarm``: the query stops before Spark commits it."""

    def __init__(self, directory):
        self.path = os.path.join(str(directory), "die-at-3")
        open(self.path, "w").close()

    def armed(self, batch_id):
        return batch_id == 3 and os.path.exists(self.path)

    def disarm(self):
        os.remove(self.path)

    def step(self, df):
        """A step after the operator, in its own stage, that fails the batch while armed (natural shape)."""
        path = self.path

        def check(frames):
            if os.path.exists(path) and int(TaskContext.get().getLocalProperty(BATCH_ID)) == 3:
                raise RuntimeError("injected: the batch fails after the state's commit, before Spark's")
            yield from frames

        return df.repartition(1).mapInPandas(check, df.schema)


def build(shape, spark, source, client, out_dir, faults, dies):
    """The streaming query of ``shape``, not started, and the object that settles its state."""
    op = lambda df: transform_with_state(df, "user", Profile(faults), OUT, client)  # noqa: E731
    parquet = ParquetSink(str(out_dir))

    def then_fail(batch_id):
        if dies.armed(batch_id):
            raise RuntimeError("injected: the driver dies after the state's commit, before Spark's")

    if shape == "sink":
        return dies.step(op(source)).writeStream.format("parquet").option("path", str(out_dir)), None
    if shape == "stream_then_foreach":
        counted = op(source)
        return counted.writeStream.foreachBatch(lambda df, i: (parquet(df, i), then_fail(i))), None
    inside = lambda df, i: (parquet(op(df), i), then_fail(i))  # noqa: E731
    if shape == "inside_foreach":
        return source.writeStream.foreachBatch(inside), None
    wrapper = exactly_once(inside, client=client, query="shapes-eo")
    return source.writeStream.foreachBatch(wrapper), wrapper


@pytest.fixture
def durable_cluster(tmp_path):
    # no backups: the killed node's partitions come back from a checkpoint, the path that rewinds a batch
    with LocalCluster(nodes=3, partitions=6, root=str(tmp_path / "cluster"), checkpoints=f"file://{tmp_path}/chk-store",
                      heartbeat_timeout=1.0, backup_count=0) as c:
        yield c


@pytest.mark.parametrize("shape", ["sink", "stream_then_foreach", "inside_foreach", "inside_exactly_once"])
def test_every_shape_is_exact_through_faults(spark, durable_cluster, tmp_path, shape):
    frames = write_files(tmp_path / "in")
    client = StateClientSpec(durable_cluster.address, retry_timeout=60.0)
    victim = durable_cluster.nodes()[0]
    (tmp_path / "faults").mkdir()
    faults, dies = Faults(tmp_path / "faults", victim.pid), DiesBeforeSparkCommits(tmp_path)
    source = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(tmp_path / "in"))
    failures = []
    for run in range(5):  # a supervisor: start the query again after it stopped on a failure
        writer, wrapper = build(shape, spark, source, client, tmp_path / "out", faults, dies)
        query = writer.option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start()
        try:
            query.awaitTermination(300)
        except StreamingQueryException:
            pass
        if query.exception() is None:
            break
        failures.append(str(query.exception()))
        if "after the state's commit" in failures[-1]:
            dies.disarm()
    else:
        pytest.fail(f"the query did not finish: {failures}")
    assert any("after the state's commit" in f for f in failures), failures  # the batch-3 fault did stop the query
    assert os.path.exists(tmp_path / "faults" / "failed-task") and os.path.exists(tmp_path / "faults" / "killed-node")
    restored = [e for e in durable_cluster.status()["events"] if e["event"] == "partition_restored"]
    assert restored and all(e["previous"] == victim.node_id for e in restored)

    (wrapper.settle if wrapper else lambda q: settle(q, client))(query)
    expected, count, files, kinds = reference(frames)
    got = spark.read.parquet(str(tmp_path / "out")).toPandas()[expected.columns.tolist()]
    got = got.sort_values(["file", "user"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected.sort_values(["file", "user"]).reset_index(drop=True), check_dtype=False)
    scope = ("shapes-eo" if wrapper else query.id, "Profile")
    users = sorted(count)
    with durable_cluster.connect() as rs:
        assert rs.value_state(state_name(*scope, "count")).get_many(users) == [count[u] for u in users]
        assert [rs.list_state(state_name(*scope, "files")).get(u) for u in users] == [files[u] for u in users]
        kind_state = rs.map_state(state_name(*scope, "kinds"))
        assert [dict(kind_state.items(u)) for u in users] == [kinds[u] for u in users]


def test_which_guarantee_each_shape_gets(spark, cluster, tmp_path):
    """Streaming shapes are exactly once and say nothing; a batch DataFrame outside a stream warns, naming at least once."""
    (tmp_path / "in").mkdir()
    pd.DataFrame({"user": ["ann", "bob"], "file": 0, "kind": "view"}).to_json(tmp_path / "in" / "0.json", orient="records", lines=True)
    op = lambda df: transform_with_state(df, "user", Profile(), OUT, cluster.address, namespace="guarantees")  # noqa: E731
    with pytest.warns(WeakerGuaranteeWarning, match="at least once, not exactly once"):
        op(spark.createDataFrame([("ann", 0, "view")], SCHEMA))
    seen = {}

    def inside(df, batch_id):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            op(df).collect()
        seen["inside foreachBatch"] = [w for w in caught if issubclass(w.category, WeakerGuaranteeWarning)]

    source = spark.readStream.schema(SCHEMA).json(str(tmp_path / "in"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        natural = op(source)
    seen["on the stream"] = [w for w in caught if issubclass(w.category, WeakerGuaranteeWarning)]
    for name, writer in (("noop", natural.writeStream.format("noop")), ("inside", source.writeStream.foreachBatch(inside))):
        query = writer.option("checkpointLocation", str(tmp_path / f"chk-{name}")).trigger(availableNow=True).start()
        query.awaitTermination(120)
        assert query.exception() is None
    assert seen == {"on the stream": [], "inside foreachBatch": []}
