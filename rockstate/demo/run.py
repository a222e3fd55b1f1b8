"""The demo's run: a CDC pipeline on PySpark, through a node failure and a node join.

A LocalCluster of state nodes (checkpoints in a local directory, or
``--storage URL``) and a Structured Streaming query on local Spark that
materializes a change-data-capture stream arriving as files: a rockstate
processor keeps each key's latest sequence number, drops stale and duplicate
events, and emits the changes through the exactly-once Parquet sink. A third
of the way in, a state node is killed (SIGKILL); two thirds in, a node joins.
With ``--ha``, three coordinators run on ZooKeeper and the leader is killed
(SIGKILL) halfway: a standby takes over and the pipeline carries on.
At the end the materialized table is compared with the ground truth computed
from the generated events: the exit code is 0 only if they are equal.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import threading
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..local.cluster import LocalCluster
from .events import chunk, generate, ground_truth, write_file


class Demo:
    def __init__(self, args: argparse.Namespace, root: str, console: Console) -> None:
        self.args, self.root, self.console = args, root, console
        self.input_dir, self.output_dir = os.path.join(root, "cdc-in"), os.path.join(root, "table")
        self.storage = args.storage or f"file://{root}/checkpoints"
        self.facts: dict = {}

    def run(self) -> int:
        a = self.args
        with Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                      TimeElapsedColumn(), console=self.console) as progress:
            phase = progress.add_task("generating CDC events", total=1, rate="")
            events = generate(a.events)
            truth = ground_truth(events)
            progress.update(phase, completed=1, rate=f"{len(events):,} events, {len(truth):,} live rows")
            phase = progress.add_task(f"starting {a.nodes} state nodes", total=1, rate="")
            ha = {"coordinators": 3, "zookeeper": True} if getattr(a, "ha", False) else {}
            with LocalCluster(nodes=a.nodes, partitions=24, root=os.path.join(self.root, "cluster"), checkpoints=self.storage,
                              backup_count=getattr(a, "backup_count", None),
                              heartbeat_timeout=4.0 if ha else 2.0, **ha) as cluster:  # with ha: leases outlast a takeover
                progress.update(phase, completed=1, rate=cluster.address)
                phase = progress.add_task("starting Spark", total=1, rate="")
                with contextlib.ExitStack() as stack:
                    master = "local[2,3]"
                    if getattr(a, "spark_cluster", False):
                        from ..local.spark import StandaloneSpark

                        master = stack.enter_context(StandaloneSpark(os.path.join(self.root, "spark"))).master
                    spark = _spark(master)
                    progress.update(phase, completed=1, rate=f"Spark {spark.version} on {master}")
                    try:
                        self.stream(spark, cluster, events, progress)
                    finally:
                        spark.stop()
                self.collect(cluster)
            phase = progress.add_task("verifying", total=1, rate="")
            from .pipeline import read_table

            table, rows_out = read_table(self.output_dir)
            self.facts.update(events_in=len(events), rows_out=rows_out, table_rows=len(table), truth_rows=len(truth))
            ok = self.verify(events, table, truth)
            progress.update(phase, completed=1, rate="")
        self.summary(ok)
        return 0 if ok else 1

    def verify(self, events, table, truth) -> bool:
        return _equal(table, truth)

    def on_batch(self, batch_id: int, cluster: LocalCluster, progress: Progress) -> None:
        """After each micro-batch's state is staged, before it commits: the demo's failure and join."""
        a = self.args
        kill_at, join_at = (None if a.no_failure else a.files // 3), (2 * a.files) // 3
        if batch_id == kill_at and "killed" not in self.facts:
            victim = cluster.nodes()[0]
            self.facts.update(killed=victim.node_id, killed_at=time.time())
            cluster.kill_node(victim.node_id)  # SIGKILL, after the batch was staged, before it commits
            progress.console.print(f"  [red]killed state node {victim.node_id} (pid {victim.pid}) during batch {batch_id}[/]")
        if getattr(a, "ha", False) and batch_id == a.files // 2 and "leader_killed" not in self.facts:
            self.facts["leader_killed"] = cluster.coordinator_addresses[cluster.kill_leader()]
            progress.console.print(f"  [red]killed the leading coordinator {self.facts['leader_killed']} during batch {batch_id}[/]")
            threading.Thread(target=self.takeover, args=(cluster, time.monotonic()), daemon=True).start()
        if batch_id == join_at and "joined" not in self.facts:
            self.facts["joined"] = "starting"
            threading.Thread(target=self.join, args=(cluster, progress), daemon=True).start()

    def stream(self, spark, cluster: LocalCluster, events, progress: Progress) -> None:
        from ..spark import StateClientSpec, exactly_once
        from .pipeline import INPUT_SCHEMA, materialize

        a = self.args
        os.makedirs(self.input_dir)
        client = StateClientSpec(cluster.address, retry_timeout=120.0)
        task = progress.add_task("streaming micro-batches", total=a.files, rate="")
        started = time.monotonic()
        done = threading.Event()
        processed = [0]

        def sink(batch_df, batch_id):
            materialize(batch_df, client, self.output_dir, batch_id)
            self.on_batch(batch_id, cluster, progress)
            processed[0] = batch_id + 1
            rate = sum(len(chunk(events, a.files, i)) for i in range(processed[0])) / (time.monotonic() - started)
            progress.update(task, completed=processed[0], rate=f"{rate:,.0f} events/s")

        def feed():  # the files arrive over time, a little faster than they are processed
            for i in range(a.files):
                write_file(chunk(events, a.files, i), self.input_dir, i)
                time.sleep(0.3)
            done.set()

        source = spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1).json(self.input_dir)
        sink_once = exactly_once(sink, client=client, query="cdc-demo", checkpoint_every=getattr(a, "checkpoint_every", None))
        query = (source.writeStream.foreachBatch(sink_once)
                 .option("checkpointLocation", os.path.join(self.root, "spark-checkpoint"))
                 .trigger(processingTime="200 milliseconds").start())
        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        try:
            done.wait()
            while query.isActive and processed[0] < a.files:
                query.awaitTermination(0.5)
            if query.exception():
                raise query.exception()
        finally:
            query.stop()
        if self.facts.get("joined") == "starting":
            deadline = time.monotonic() + 120
            while self.facts["joined"] == "starting" and time.monotonic() < deadline:
                time.sleep(0.1)

    def takeover(self, cluster: LocalCluster, killed_at: float) -> None:
        from ..local.cluster import wait_until

        wait_until(lambda: cluster.status()["coordinators"]["leader"] not in (None, self.facts["leader_killed"]), 60, "a standby to lead")
        self.facts.update(new_leader=cluster.status()["coordinators"]["leader"], takeover_seconds=time.monotonic() - killed_at)

    def join(self, cluster: LocalCluster, progress: Progress) -> None:
        info = cluster.add_node()
        self.facts["joined"] = info.node_id
        progress.console.print(f"  [green]node {info.node_id} joined; partitions moved to it while the pipeline ran[/]")

    def collect(self, cluster: LocalCluster) -> None:
        """Checkpoint, failover and migration facts, from the cluster itself."""
        with cluster.connect() as rs:
            done = [c for c in rs.checkpoints() if c.state == "COMPLETED"]
            events = rs.backend.events()  # all kept (the status document's last 100 may no longer hold the kill's)
        self.facts["checkpoints"] = len(done)
        self.facts["checkpoint_median"] = statistics.median(c.duration for c in done) if done else None
        restored = [e for e in events if e["event"] == "partition_restored"]
        if restored:
            self.facts["restore_seconds"] = max(e["time"] for e in restored) - self.facts["killed_at"]
            # None: restored before any checkpoint completed (empty); a node declared dead later restores to one
            self.facts["restored_to"] = sorted({e["checkpoint"] for e in restored}, key=lambda c: -1 if c is None else c)
            self.facts["restored_partitions"] = len(restored)
        promoted = [e for e in events if e["event"] == "primary_promoted"]
        if promoted:  # with backups: the killed node's partitions went on from their in-sync backups
            self.facts["promoted_partitions"] = len(promoted)
            self.facts["promote_seconds"] = max(e["time"] for e in promoted) - self.facts["killed_at"]
        moves = [e for e in events if e["event"] == "migration_finished" and e.get("target") == self.facts.get("joined")]
        self.facts["moved"] = len(moves)
        self.facts["max_window"] = max((e["write_blocked_seconds"] for e in moves), default=None)

    def summary(self, ok: bool) -> None:
        f = self.facts
        table = Table("", "", title="rockstate CDC demo")
        table.add_row("events in", f"{f['events_in']:,} (with duplicates and out-of-order deliveries)")
        table.add_row("rows out", f"{f['rows_out']:,} changes; materialized table {f['table_rows']:,} rows")
        med = f.get("checkpoint_median")
        table.add_row("checkpoints", f"{f['checkpoints']} completed, median {med * 1000:.0f} ms" if med else "none")
        if "killed" in f:
            failover = (f"{f['killed']} killed; {f.get('restored_partitions', 0)} partitions restored to checkpoint "
                        f"{f.get('restored_to')} in {f['restore_seconds']:.2f} s" if "restore_seconds" in f else f"{f['killed']} killed; no restore seen")
            if "promote_seconds" in f:
                failover = (f"{f['killed']} killed; {f['promoted_partitions']} partitions promoted to their in-sync backups in "
                            f"{f['promote_seconds']:.2f} s, no rewind" + (f" ({f['restored_partitions']} restored)" if "restore_seconds" in f else ""))
        else:
            failover = "no failure (--no-failure)"
        table.add_row("failover", failover)
        if "leader_killed" in f:
            table.add_row("coordinators", f"leader {f['leader_killed']} killed; {f.get('new_leader', 'no standby')} led "
                          + (f"{f['takeover_seconds']:.2f} s later" if "takeover_seconds" in f else "(not seen)"))
        window = f.get("max_window")
        table.add_row("migration", f"{f['moved']} partitions moved to {f.get('joined')}, largest write-blocked window "
                      + (f"{window * 1000:.0f} ms" if window is not None else "-"))
        self.console.print(table)
        verdict = "[bold green]OK[/]" if ok else "[bold red]MISMATCH[/]"
        self.console.print(f"verification: materialized table vs ground truth from the generated events "
                           f"({f['table_rows']:,} vs {f['truth_rows']:,} rows): {verdict}")


def _spark(master: str = "local[2,3]"):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from ..local.spark import executor_env

    builder = (SparkSession.builder.master(master).appName("rockstate-cdc-demo")
               .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "4"))
    if master.startswith("spark://"):  # executors in their own JVMs: hand them the Python and import path
        builder = builder.config("spark.executor.memory", "512m").config("spark.cores.max", "2")
        for key, value in executor_env().items():
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _equal(table, truth) -> bool:
    import pandas as pd

    try:
        pd.testing.assert_frame_equal(table, truth, check_dtype=False)
        return True
    except AssertionError:
        return False
