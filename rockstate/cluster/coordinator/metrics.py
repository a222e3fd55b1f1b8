"""The coordinator's Prometheus metrics: counted from its events as they happen, read from its state when scraped.

Every name here is listed in docs/operations.md and used by docs/grafana/rockstate.json.
"""

from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, PlatformCollector, ProcessCollector
from prometheus_client.core import GaugeMetricFamily

from ...control.membership import MemberStatus
from .checkpoints import ClusterCheckpoints
from .state import ClusterState

CHECKPOINT_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
BATCH_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class CoordinatorMetrics:
    """The coordinator's metrics: counted from its events as they happen, and read from its state when scraped."""

    def __init__(self, state: ClusterState, checkpoints: Callable[[], ClusterCheckpoints | None]) -> None:
        """``state``: the record read when scraped; ``checkpoints()``: the cluster's, if any."""
        self.state, self._checkpoints = state, checkpoints
        self.registry = r = CollectorRegistry()
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        self.migrations = Counter("rockstate_coordinator_migrations", "Partition moves that ended, by result", ["result"], registry=r)
        self.migration_seconds = Histogram("rockstate_coordinator_migration_seconds", "Duration of finished partition moves", buckets=CHECKPOINT_BUCKETS, registry=r)
        self.restored = Counter("rockstate_coordinator_failover_partitions", "Partitions of dead nodes restored elsewhere (failover)", registry=r)
        self.members_dead = Counter("rockstate_coordinator_members_died", "Nodes declared dead after heartbeat_timeout of silence", registry=r)
        self.checkpoints = Counter("rockstate_coordinator_checkpoints", "Checkpoints that ended, by result", ["result"], registry=r)
        self.checkpoint_seconds = Histogram("rockstate_coordinator_checkpoint_seconds", "Duration of completed checkpoints", buckets=CHECKPOINT_BUCKETS, registry=r)
        self.checkpoint_uploaded = Counter("rockstate_coordinator_checkpoint_uploaded_bytes", "Bytes uploaded by completed checkpoints", registry=r)
        self.checkpoint_size = Gauge("rockstate_coordinator_checkpoint_size_bytes", "Size of the latest completed checkpoint", registry=r)
        self.batch_seconds = Histogram("rockstate_pipeline_batch_seconds", "Duration of pipeline batches, by query", ["query"], buckets=BATCH_BUCKETS, registry=r)
        self.batch_checkpoint_seconds = Histogram("rockstate_pipeline_checkpoint_seconds", "Seconds a batch spent committing its state, by query", ["query"], buckets=BATCH_BUCKETS, registry=r)
        self.rows = Counter("rockstate_pipeline_rows", "Rows through pipelines' stateful operators, by query and direction", ["query", "direction"], registry=r)
        self.moving: set[int] = set()
        self._seen_batches: dict[str, int] = {}
        r.register(self)  # collect() below: figures read from the coordinator's state

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
            self.restored.inc()
        elif event == "member_dead":
            self.members_dead.inc()
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
        states = dict.fromkeys((str(s) for s in MemberStatus), 0)
        for m in c.membership.members.values():
            states[str(m.status)] += 1
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
        checkpoints = self._checkpoints()
        latest = checkpoints.latest() if checkpoints is not None else None
        yield GaugeMetricFamily("rockstate_coordinator_checkpoint_latest_id", "Id of the latest completed checkpoint (-1: none)", -1 if latest is None else latest)
