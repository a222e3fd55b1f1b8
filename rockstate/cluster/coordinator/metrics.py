"""The coordinator's Prometheus metrics: counted from its events as they happen, read from its state when scraped.

Every name here is listed in docs/operations.md and used by docs/grafana/rockstate.json.
"""

from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, PlatformCollector, ProcessCollector
from prometheus_client.core import GaugeMetricFamily

from ...control.membership import SUSPECT, MemberStatus
from ..health import short_partitions
from ..loop_lag import LoopLag
from ..replication.in_sync import ReplicaControl
from .checkpoints import ClusterCheckpoints
from .state import ClusterState

CHECKPOINT_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
BATCH_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class CoordinatorMetrics:
    """The coordinator's metrics: counted from its events as they happen, and read from its state when scraped."""

    def __init__(self, state: ClusterState, checkpoints: Callable[[], ClusterCheckpoints | None],
                 replicas: ReplicaControl | None = None) -> None:
        """``state``: the record read when scraped; ``checkpoints()``: the cluster's, if any; ``replicas``: the
        replica sets read when scraped (None: no replica figures)."""
        self.state, self._checkpoints, self._replicas = state, checkpoints, replicas
        self.registry = r = CollectorRegistry()
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        self.migrations = Counter("rockstate_coordinator_migrations", "Partition moves that ended, by result", ["result"], registry=r)
        self.migration_seconds = Histogram("rockstate_coordinator_migration_seconds", "Duration of finished partition moves", buckets=CHECKPOINT_BUCKETS, registry=r)
        self.failover = Counter("rockstate_coordinator_failover_partitions", "Partitions of dead nodes that got a new owner, by how: "
                                "promoted (an in-sync backup became primary) or restored (from a checkpoint)", ["how"], registry=r)
        self.promotions = Counter("rockstate_coordinator_promotions", "Elections of a new primary for a partition whose primary died, "
                                  "by result: promoted, or failed (no in-sync backup answered with a copy: the checkpoint restores it)",
                                  ["result"], registry=r)
        self.members_dead = Counter("rockstate_coordinator_members_died", "Nodes declared dead after heartbeat_timeout of silence", registry=r)
        self.members_suspected = Counter("rockstate_coordinator_members_suspected", "Nodes that became suspect (silent for a third of heartbeat_timeout)", registry=r)
        self.out_of_sync = Counter("rockstate_coordinator_replicas_out_of_sync", "In-sync backups that left their partition's in-sync set (unreachable or diverged)", registry=r)
        self.replica_copies = Counter("rockstate_coordinator_replica_copies", "Backups copied from their primary (a new backup, or one catching up anew)", registry=r)
        self.elections = Counter("rockstate_coordinator_elections", "Times a coordinator took the lead (with ZooKeeper: each election won)", registry=r)
        for how in ("promoted", "restored"):
            self.failover.labels(how)
        for result in ("promoted", "failed"):
            self.promotions.labels(result)
        self.checkpoints = Counter("rockstate_coordinator_checkpoints", "Checkpoints that ended, by result", ["result"], registry=r)
        self.checkpoint_seconds = Histogram("rockstate_coordinator_checkpoint_seconds", "Duration of completed checkpoints", buckets=CHECKPOINT_BUCKETS, registry=r)
        self.checkpoint_uploaded = Counter("rockstate_coordinator_checkpoint_uploaded_bytes", "Bytes uploaded by completed checkpoints", registry=r)
        self.checkpoint_size = Gauge("rockstate_coordinator_checkpoint_size_bytes", "Size of the latest completed checkpoint", registry=r)
        self.batch_seconds = Histogram("rockstate_pipeline_batch_seconds", "Duration of pipeline batches, by query", ["query"], buckets=BATCH_BUCKETS, registry=r)
        self.batch_checkpoint_seconds = Histogram("rockstate_pipeline_checkpoint_seconds", "Seconds a batch spent committing its state, by query", ["query"], buckets=BATCH_BUCKETS, registry=r)
        self.rows = Counter("rockstate_pipeline_rows", "Rows through pipelines' stateful operators, by query and direction", ["query", "direction"], registry=r)
        self.loop_lag = LoopLag("rockstate_coordinator", r)  # started by the coordinator, on its loop
        self.moving: set[int] = set()
        self._seen_batches: dict[str, int] = {}
        r.register(self)  # collect() below: figures read from the coordinator's state

    def read_replicas(self, replicas: ReplicaControl) -> None:
        """The replica sets whose figures (under-replicated, electing, out of sync) are read when scraped."""
        self._replicas = replicas

    def observe(self, event: str, data: dict) -> None:
        """Count one coordinator event (see ``Coordinator.event``)."""
        if event == "migration_started":
            self.moving.add(data["partition"])
        elif event in ("migration_finished", "migration_failed"):
            self.moving.discard(data["partition"])
            self.migrations.labels(event.split("_")[1]).inc()
            if "seconds" in data:
                self.migration_seconds.observe(data["seconds"])
        elif event == "partition_restored":
            self.failover.labels("restored").inc()
        elif event == "primary_promoted":
            self.failover.labels("promoted").inc()
            self.promotions.labels("promoted").inc()
        elif event == "promotion_failed":
            self.promotions.labels("failed").inc()
        elif event == "member_dead":
            self.members_dead.inc()
        elif event == "member_suspect":
            self.members_suspected.inc()
        elif event == "replica_out_of_sync":
            self.out_of_sync.inc()
        elif event == "replica_copied":
            self.replica_copies.inc()
        elif event == "coordinator_elected":
            self.elections.inc()
        elif event == "checkpoint_completed":
            self.checkpoints.labels("completed").inc()
            self.checkpoint_seconds.observe(data.get("seconds") or 0)
            self.checkpoint_uploaded.inc(data.get("bytes_uploaded") or 0)
            checkpoints = self._checkpoints()
            history = checkpoints.history() if checkpoints is not None else []  # (an event of the checkpoints: they exist)
            record = next((r for r in reversed(history) if r["checkpoint_id"] == data["checkpoint"]), None)
            if record is not None:
                self.checkpoint_size.set(record["size"])
        elif event == "checkpoint_aborted":
            self.checkpoints.labels("aborted").inc()

    def pipeline(self, record: dict) -> None:
        """Observe the batches of a pipeline's progress report that were not seen yet."""
        query = record["query"]
        seen = self._seen_batches.get(query, -1)
        for batch in record.get("batches", []):
            if batch.get("batch", -1) > seen:
                self.batch_seconds.labels(query).observe(batch.get("seconds") or 0)
                self.batch_checkpoint_seconds.labels(query).observe(batch.get("checkpoint_seconds") or 0)
                self.rows.labels(query, "in").inc(batch.get("rows_in") or 0)
                self.rows.labels(query, "out").inc(batch.get("rows_out") or 0)
                seen = batch["batch"]
        self._seen_batches[query] = seen

    def collect(self) -> Iterator[GaugeMetricFamily]:
        c = self.state
        members = GaugeMetricFamily("rockstate_coordinator_members", "Nodes by membership state", labels=["state"])
        states = dict.fromkeys([*(str(s) for s in MemberStatus), SUSPECT], 0)
        for m in c.membership.members.values():
            states[m.shown] += 1  # a suspect member is counted as suspect, not alive
        for state, n in states.items():
            members.add_metric([state], n)
        yield members
        owners = c.table.owners
        live = {m.node_id for m in c.membership.members.values() if m.status in (MemberStatus.ALIVE, MemberStatus.LEAVING)}
        yield GaugeMetricFamily("rockstate_coordinator_partitions", "Partitions of the cluster (P)", len(owners))
        yield GaugeMetricFamily("rockstate_coordinator_partitions_unavailable", "Partitions without a live owner", sum(o not in live for o in owners))
        yield GaugeMetricFamily("rockstate_coordinator_table_epoch", "The partition table's epoch", c.table.epoch)
        yield GaugeMetricFamily("rockstate_coordinator_migrations_in_flight", "Partitions moving now", len(self.moving))
        yield GaugeMetricFamily("rockstate_coordinator_failovers_pending", "Dead nodes whose partitions are not restored yet", len(c.failovers))
        replicas = self._replicas
        if replicas is not None:
            rows = replicas.status() if replicas.enabled else []
            status = {"backup_count": replicas.backup_count, "replicas": rows}
            yield GaugeMetricFamily("rockstate_coordinator_partitions_under_replicated",
                                    "Partitions short of in-sync backups (fewer than backup_count, catching up, or electing a primary)",
                                    len(short_partitions(status)))
            yield GaugeMetricFamily("rockstate_coordinator_partitions_electing", "Partitions waiting for the election of a new primary",
                                    sum(bool(r["waiting_for_election"]) for r in rows))
            yield GaugeMetricFamily("rockstate_coordinator_backups_out_of_sync", "Backups not in their partition's in-sync set (catching up)",
                                    sum(not b["in_sync"] for r in rows for b in r["backups"]))
        checkpoints = self._checkpoints()
        latest = checkpoints.latest() if checkpoints is not None else None
        yield GaugeMetricFamily("rockstate_coordinator_checkpoint_latest_id", "Id of the latest completed checkpoint (-1: none)", -1 if latest is None else latest)
