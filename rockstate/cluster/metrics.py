"""A node's Prometheus metrics: requests, keys, partitions, RocksDB, disk and the process.

Request figures are counted as requests run; RocksDB and disk figures are
read when scraped (``NodeCollector``), from the partitions open then. The
same figures answer the coordinator's ``NodeFigures`` request, for the status
page. Every name here is listed in docs/operations.md and used by
docs/grafana/rockstate.json.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
from bisect import bisect_left
from functools import wraps
from itertools import accumulate
from typing import TYPE_CHECKING, Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, PlatformCollector, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString
from prometheus_client.exposition import start_http_server

from . import protocol as p

if TYPE_CHECKING:
    from .node import Node

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)

# RocksDB integer properties, summed over a node's open partitions and their states (column families)
ROCKSDB_PROPERTIES = {
    "memtable_bytes": ("rocksdb.cur-size-all-mem-tables", "Memtable bytes (active and unflushed)"),
    "pending_compaction_bytes": ("rocksdb.estimate-pending-compaction-bytes", "Bytes compaction estimates it must rewrite"),
    "sst_bytes": ("rocksdb.total-sst-files-size", "Bytes of SST files (all versions)"),
    "estimated_keys": ("rocksdb.estimate-num-keys", "Keys RocksDB estimates it holds"),
    "running_compactions": ("rocksdb.num-running-compactions", "Compactions running now"),
}
_STALLS = re.compile(r"total-(delays|stops): (\d+)")


def rocksdb_figures(node: Node) -> dict[str, int]:
    """RocksDB figures of the node's open partitions (zeros before it has a store)."""
    figures = dict.fromkeys([*ROCKSDB_PROPERTIES, "write_delays", "write_stops"], 0)
    store = node.store
    if store is None:
        return {**figures, "block_cache_bytes": 0, "block_cache_pinned_bytes": 0}
    for pid in store.owned():
        try:
            for family in store.partition(pid).column_families():
                for name, (prop, _) in ROCKSDB_PROPERTIES.items():
                    figures[name] += family.property_int_value(prop) or 0
                for kind, n in _STALLS.findall(family.property_value("rocksdb.cf-write-stall-stats") or ""):
                    figures["write_" + kind] += int(n)
        except Exception:  # noqa: BLE001 -- a partition closed while being read (it moved away): skip it
            continue
    cache = store.resources.cache
    return {**figures, "block_cache_bytes": cache.get_usage(), "block_cache_pinned_bytes": cache.get_pinned_usage()}


def disk_figures(path: str) -> dict[str, int]:
    """Bytes under ``path``, and the free and total bytes of its file system."""
    used = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                used += os.lstat(os.path.join(root, name)).st_size
            except OSError:  # removed meanwhile (a compaction, a retired partition)
                pass
    usage = shutil.disk_usage(path)
    return {"used_bytes": used, "free_bytes": usage.free, "total_bytes": usage.total}


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class NodeCollector:
    """RocksDB and disk gauges, read at each scrape."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def collect(self):
        rocks = rocksdb_figures(self.node)
        yield GaugeMetricFamily("rockstate_node_rocksdb_block_cache_bytes", "Block cache usage (data, index and filter blocks, memtables)", rocks["block_cache_bytes"])
        yield GaugeMetricFamily("rockstate_node_rocksdb_block_cache_pinned_bytes", "Block cache entries pinned in use", rocks["block_cache_pinned_bytes"])
        yield GaugeMetricFamily("rockstate_node_memory_limit_bytes", "The node's memory_bytes: the block cache's capacity", self.node.config.memory_bytes)
        for name, (_, doc) in ROCKSDB_PROPERTIES.items():
            yield GaugeMetricFamily(f"rockstate_node_rocksdb_{name}", doc, rocks[name])
        stalls = GaugeMetricFamily("rockstate_node_rocksdb_write_stalls", "Write stalls counted by the open partitions, by kind", labels=["kind"])
        stalls.add_metric(["delay"], rocks["write_delays"])
        stalls.add_metric(["stop"], rocks["write_stops"])
        yield stalls
        disk = disk_figures(self.node.data_dir)
        yield GaugeMetricFamily("rockstate_node_disk_used_bytes", "Bytes under the node's data directory", disk["used_bytes"])
        yield GaugeMetricFamily("rockstate_node_disk_free_bytes", "Free bytes of the data directory's file system", disk["free_bytes"])


class RequestFigures:
    """Requests' latency by operation and the keys read and written, counted in plain Python numbers.

    A request's one observation is a bisect and two additions: prometheus_client's
    ``Histogram.observe`` and ``Counter.inc``, with their locks, took ~5 µs, a third of
    a one-key read's handling. Exported when scraped, as the histogram
    ``rockstate_node_request_seconds`` (its ``_count``: the successes) and the counters
    ``rockstate_node_keys_read_total`` / ``_written_total``. Counted on the event loop's
    thread; a scrape, from another thread, may see a request's count before its sum.
    """

    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.buckets = buckets
        self.counts: dict[str, list[int]] = {}  # op -> requests per bucket (the last: above every bound)
        self.sums: dict[str, float] = {}
        self.keys_read = self.keys_written = 0

    def recorder(self, op: str) -> Callable[[float], None]:
        """``observe(seconds)`` of one successful ``op`` request."""
        counts = self.counts.setdefault(op, [0] * (len(self.buckets) + 1))
        sums, buckets = self.sums, self.buckets
        sums.setdefault(op, 0.0)

        def observe(seconds: float) -> None:
            counts[bisect_left(buckets, seconds)] += 1  # a bucket's bound is inclusive: le
            sums[op] += seconds

        return observe

    def collect(self):
        latency = HistogramMetricFamily("rockstate_node_request_seconds", "Latency of successful requests, by operation", labels=["op"])
        bounds = [*map(floatToGoString, self.buckets), "+Inf"]
        for op, counts in list(self.counts.items()):
            latency.add_metric([op], list(zip(bounds, accumulate(counts))), self.sums[op])
        yield latency
        yield CounterMetricFamily("rockstate_node_keys_written", "Keys written (puts and deletes)", self.keys_written)
        yield CounterMetricFamily("rockstate_node_keys_read", "Keys read", self.keys_read)


class NodeMetrics:
    def __init__(self, node: Node | None = None) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes, process_cpu_seconds_total, open fds...
        PlatformCollector(registry=self.registry)
        self.failures = Counter("rockstate_node_request_failures", "Requests that failed, by operation", ["op"], registry=self.registry)
        self.requests = RequestFigures()  # on the hot path: latency, keys read and written
        self.registry.register(self.requests)
        self.partitions = Gauge("rockstate_node_partitions", "Partitions owned", registry=self.registry)
        self.node = node
        if node is not None:
            self.registry.register(NodeCollector(node))
        self.handlers = {p.NodeFigures: self.figures, p.NodeIdentity: self.identity}
        self._http = None

    async def figures(self, msg: p.NodeFigures, conn) -> dict:
        """Memory, disk and RocksDB figures, for the coordinator's status page (the disk walk off the event loop)."""
        node = self.node
        return {"rss_bytes": rss_bytes(), "memory_limit_bytes": node.config.memory_bytes, "rocksdb": rocksdb_figures(node),
                "disk": await asyncio.to_thread(disk_figures, node.data_dir)}

    async def identity(self, msg: p.NodeIdentity, conn) -> str | None:
        return self.node.node_id

    def timed(self, handlers: dict) -> dict:
        """The same handlers, each counted and timed."""
        return {cls: self._wrap(cls.op, handler) for cls, handler in handlers.items()}

    def _wrap(self, op: str, handler):
        observe, failed = self.requests.recorder(op), self.failures.labels(op)

        @wraps(handler)
        async def timed(msg, conn):
            start = time.perf_counter()
            try:
                result = await handler(msg, conn)
            except BaseException:
                failed.inc()
                raise
            observe(time.perf_counter() - start)
            return result

        return timed

    def serve(self, host: str, port: int) -> int:
        """Expose /metrics over HTTP; returns the bound port."""
        self._http, _thread = start_http_server(port, host, registry=self.registry)
        return self._http.server_port

    def text(self) -> str:
        return generate_latest(self.registry).decode()

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http = None


CHECKPOINT_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
BATCH_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class CoordinatorMetrics:
    """The coordinator's metrics: counted from its events as they happen, and read from its state when scraped."""

    def __init__(self, coordinator) -> None:
        self.coordinator = coordinator
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
            record = next((r for r in reversed(self.coordinator.checkpoints.history()) if r["checkpoint_id"] == data["checkpoint"]), None)
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

    def collect(self):
        c = self.coordinator
        members = GaugeMetricFamily("rockstate_coordinator_members", "Nodes by membership state", labels=["state"])
        states = {"alive": 0, "dead": 0, "leaving": 0, "left": 0}
        for m in c.members.values():
            states[str(m.status)] = states.get(str(m.status), 0) + 1
        for state, n in states.items():
            members.add_metric([state], n)
        yield members
        owners = c.table.owners
        live = {m.node_id for m in c.members.values() if str(m.status) in ("alive", "leaving")}
        yield GaugeMetricFamily("rockstate_coordinator_partitions", "Partitions of the cluster (P)", len(owners))
        yield GaugeMetricFamily("rockstate_coordinator_partitions_unavailable", "Partitions without a live owner", sum(o not in live for o in owners))
        yield GaugeMetricFamily("rockstate_coordinator_table_epoch", "The partition table's epoch", c.table.epoch)
        yield GaugeMetricFamily("rockstate_coordinator_migrations_in_flight", "Partitions moving now", len(self.moving))
        yield GaugeMetricFamily("rockstate_coordinator_failovers_pending", "Dead nodes whose partitions are not restored yet", len(c.failovers))
        latest = c.checkpoints.latest() if c.checkpoints is not None else None
        yield GaugeMetricFamily("rockstate_coordinator_checkpoint_latest_id", "Id of the latest completed checkpoint (-1: none)", -1 if latest is None else latest)
