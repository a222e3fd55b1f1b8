"""The demo's pipeline on a real Spark cluster (standalone master and two workers, executors in their own JVMs)
and through Spark Connect (no SparkContext on the client), each with a state node killed midway.

What a node's death does is the cluster's default first: its partitions are promoted to their in-sync backups
(``primary_promoted``), nothing is restored from a checkpoint and no batch is rewound. With ``backup_count 0``
there is no backup to promote: the partitions are restored from the last checkpoint (``partition_restored``),
the query stops on the rewind and is started again, and the output is still exact.

About a minute and a half: ``make spark-cluster`` runs them (marker ``spark_cluster``), and ``make test`` runs
them too, after the rest of the suite.
"""

import argparse
import io
import os
import threading

import pandas as pd
import pytest
from pyspark.errors import StreamingQueryException
from rich.console import Console

from rockstate import LocalCluster
from rockstate.demo.events import chunk, generate, ground_truth, write_file
from rockstate.demo.pipeline import INPUT_SCHEMA, OUTPUT_SCHEMA, LatestBySeq
from rockstate.demo.run import Demo
from rockstate.spark import StateClientSpec, close_clients, transform_with_state
from rockstate.testing.chaos import reference_changes
from rockstate.local.spark import ConnectServer, connect_server_bundled

pytestmark = [pytest.mark.spark_cluster, pytest.mark.timeout(900)]


def test_the_demo_on_a_standalone_cluster_with_a_node_killed(tmp_path):
    args = argparse.Namespace(events=6000, nodes=3, storage=None, no_failure=False, files=6, spark_cluster=True)
    out = io.StringIO()
    demo = Demo(args, str(tmp_path), Console(file=out, width=200))
    assert demo.run() == 0, out.getvalue()
    # the default: the killed node's partitions went on from their in-sync backups, nothing was rewound
    assert "killed" in demo.facts and demo.facts.get("promoted_partitions"), out.getvalue()
    assert not demo.facts.get("restored_partitions"), out.getvalue()
    assert "no rewind" in out.getvalue()
    assert "on spark://127.0.0.1:" in out.getvalue()
    # each worker ran an executor (its own JVM, with its own Python workers) for the application
    for worker in ("worker-0", "worker-1"):
        apps = os.listdir(tmp_path / "spark" / worker)
        assert apps and all(app.startswith("app-") for app in apps), apps


@pytest.mark.skipif(not connect_server_bundled(), reason="this pyspark (3.5) has no Spark Connect server jar")
@pytest.mark.parametrize("backup_count", [None, 0], ids=["promotion", "restore"])
def test_the_pipeline_through_spark_connect_with_a_node_killed(tmp_path, backup_count):
    from pyspark.sql import SparkSession

    events = generate(6000)
    truth = ground_truth(events)
    files = 6
    (tmp_path / "in").mkdir()
    for i in range(files):
        write_file(chunk(events, files, i), str(tmp_path / "in"), i)
        os.utime(tmp_path / "in" / f"cdc-{i:04d}.json", (1_700_000_000 + i, 1_700_000_000 + i))
    with LocalCluster(nodes=3, partitions=12, root=str(tmp_path / "cluster"), checkpoints=f"file://{tmp_path}/chk-store",
                      backup_count=backup_count, heartbeat_timeout=1.0) as cluster, ConnectServer(str(tmp_path / "connect"), conf={"spark.sql.shuffle.partitions": "4"}) as server:
        spark = SparkSession.builder.remote(server.remote).getOrCreate()  # the client side: no SparkContext
        try:
            client = StateClientSpec(cluster.address, retry_timeout=60.0)
            victim = cluster.nodes()[0]
            killed = threading.Event()
            failures = []
            for run in range(4):  # a state node's death stops the query; it is started again, as a supervisor would
                source = spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1).json(str(tmp_path / "in"))
                changes = transform_with_state(source, "id", LatestBySeq(), OUTPUT_SCHEMA, client)
                query = (changes.writeStream.format("parquet").option("path", str(tmp_path / "out"))
                         .option("checkpointLocation", str(tmp_path / "spark-chk")).trigger(availableNow=True).start())
                while query.isActive:
                    progress = query.lastProgress
                    if progress is not None and progress["batchId"] >= 2 and not killed.is_set():
                        cluster.kill_node(victim.node_id)  # SIGKILL, while the next batch runs
                        killed.set()
                    try:
                        query.awaitTermination(0.2)
                    except StreamingQueryException:
                        break
                if query.exception() is None:
                    break
                failures.append(str(query.exception())[:500])
            else:
                pytest.fail(f"the query did not finish: {failures}")
            assert killed.is_set()
            log = cluster.status()["events"]
            promoted = [e for e in log if e["event"] == "primary_promoted"]
            restored = [e for e in log if e["event"] == "partition_restored"]
            if backup_count is None:  # the default: promotion to the in-sync backups, no restore, no rewind
                assert promoted and all(e["previous"] == victim.node_id for e in promoted), log
                assert not restored, restored
                assert not failures, failures  # the query ran through the death: no batch was rewound
            else:  # no backup: the victim's partitions restored from the checkpoint, the query started again
                assert restored and all(e["previous"] == victim.node_id for e in restored), log
                assert not promoted, promoted
            rows = spark.read.parquet(str(tmp_path / "out")).toPandas()  # the file sink's log: committed batches only
        finally:
            spark.stop()
            close_clients()
    latest = rows.sort_values(["id", "seq"]).drop_duplicates("id", keep="last")
    table = latest[latest.op != "delete"][["id", "seq", "name", "amount"]].sort_values("id").reset_index(drop=True)
    pd.testing.assert_frame_equal(table, truth, check_dtype=False)
    # the same change rows as a fault-free run of the processor, none lost, none repeated
    expected = pd.concat(reference_changes(events, files))
    assert sorted(zip(rows["id"], rows["seq"])) == sorted(zip(expected["id"], expected["seq"]))
