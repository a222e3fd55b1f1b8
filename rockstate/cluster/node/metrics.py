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
import ssl
import time
from bisect import bisect_left
from functools import wraps
from itertools import accumulate
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Awaitable, Callable, Iterator

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, PlatformCollector, ProcessCollector,
                               generate_latest)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from ...store import Store
from .. import protocol as p
from ..loop_lag import LoopLag
from ..security import Security

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)
# the requests clients send: the status page's throughput and latency (a move's or a checkpoint's steps would
# swamp a quiet node's latency with seconds-long requests that no client waits for)
CLIENT_OPS = frozenset(m.op for m in (p.Write, p.WriteRuns, p.CompareAndSet, p.Read, p.Scan, p.ScanMany, p.Stage, p.StageDone,
                                      p.AdvanceBatches, p.FinishTask, p.Seal))

# RocksDB integer properties, summed over the node's RocksDB's states (column families)
ROCKSDB_PROPERTIES = {
    "memtable_bytes": ("rocksdb.cur-size-all-mem-tables", "Memtable bytes (active and unflushed)"),
    "pending_compaction_bytes": ("rocksdb.estimate-pending-compaction-bytes", "Bytes compaction estimates it must rewrite"),
    "sst_bytes": ("rocksdb.total-sst-files-size", "Bytes of SST files (all versions)"),
    "estimated_keys": ("rocksdb.estimate-num-keys", "Keys RocksDB estimates it holds"),
    "running_compactions": ("rocksdb.num-running-compactions", "Compactions running now"),
}
_STALLS = re.compile(r"total-(delays|stops): (\d+)")


def rocksdb_figures(store: Store | None) -> dict[str, int]:
    """RocksDB figures of the node's open partitions (zeros before it has a store)."""
    figures = dict.fromkeys([*ROCKSDB_PROPERTIES, "write_delays", "write_stops"], 0)
    if store is None:
        return {**figures, "block_cache_bytes": 0, "block_cache_pinned_bytes": 0}
    try:
        for family in [store.db.db, *store.db.families.values()]:
            for name, (prop, _) in ROCKSDB_PROPERTIES.items():
                figures[name] += family.property_int_value(prop) or 0
            for kind, n in _STALLS.findall(family.property_value("rocksdb.cf-write-stall-stats") or ""):
                figures["write_" + kind] += int(n)
    except Exception:  # noqa: BLE001 -- the store closed while being read (the node stops)
        pass
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

    def __init__(self, store_of: Callable[[], Store | None], memory_bytes: int, data_dir: str) -> None:
        self.store_of, self.memory_bytes, self.data_dir = store_of, memory_bytes, data_dir

    def collect(self) -> Iterator[GaugeMetricFamily]:
        rocks = rocksdb_figures(self.store_of())
        yield GaugeMetricFamily("rockstate_node_rocksdb_block_cache_bytes", "Block cache usage (data, index and filter blocks, memtables)", rocks["block_cache_bytes"])
        yield GaugeMetricFamily("rockstate_node_rocksdb_block_cache_pinned_bytes", "Block cache entries pinned in use", rocks["block_cache_pinned_bytes"])
        yield GaugeMetricFamily("rockstate_node_memory_limit_bytes", "The node's memory_bytes: the block cache's capacity", self.memory_bytes)
        for name, (_, doc) in ROCKSDB_PROPERTIES.items():
            yield GaugeMetricFamily(f"rockstate_node_rocksdb_{name}", doc, rocks[name])
        stalls = GaugeMetricFamily("rockstate_node_rocksdb_write_stalls", "Write stalls counted by the open partitions, by kind", labels=["kind"])
        stalls.add_metric(["delay"], rocks["write_delays"])
        stalls.add_metric(["stop"], rocks["write_stops"])
        yield stalls
        disk = disk_figures(self.data_dir)
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

    def collect(self) -> Iterator[HistogramMetricFamily | CounterMetricFamily]:
        latency = HistogramMetricFamily("rockstate_node_request_seconds", "Latency of successful requests, by operation", labels=["op"])
        bounds = [*map(floatToGoString, self.buckets), "+Inf"]
        for op, counts in list(self.counts.items()):
            latency.add_metric([op], list(zip(bounds, accumulate(counts))), self.sums[op])
        yield latency
        yield CounterMetricFamily("rockstate_node_keys_written", "Keys written (puts and deletes)", self.keys_written)
        yield CounterMetricFamily("rockstate_node_keys_read", "Keys read", self.keys_read)

    def load(self) -> dict:
        """The clients' requests since the node started, as counters (the coordinator takes rates from two of them):
        requests, their seconds, their latency buckets (counts up to each of ``bounds``, the last above every bound), keys."""
        mine = [op for op in list(self.counts) if op in CLIENT_OPS]
        buckets = [sum(n) for n in zip(*(self.counts[op] for op in mine))] or [0] * (len(self.buckets) + 1)
        return {"requests": sum(buckets), "seconds": sum(self.sums[op] for op in mine), "bounds": list(self.buckets),
                "buckets": buckets, "keys_read": self.keys_read, "keys_written": self.keys_written}


class NodeMetrics:
    def __init__(self, collector: NodeCollector, node_id: Callable[[], str | None]) -> None:
        """``collector``: the node's RocksDB and disk figures; ``node_id()``: its id once registered."""
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes, process_cpu_seconds_total, open fds...
        PlatformCollector(registry=self.registry)
        self.failures = Counter("rockstate_node_request_failures", "Requests that failed, by operation", ["op"], registry=self.registry)
        self.requests = RequestFigures()  # on the hot path: latency, keys read and written
        self.registry.register(self.requests)
        self.partitions = Gauge("rockstate_node_partitions", "Partitions owned", registry=self.registry)
        self.replica_kept = Gauge("rockstate_node_replica_kept_bytes", "What the batches the node's replicas keep in memory "
                                  "weigh (its primaries' logs, its backups' tails), within an eighth of memory_bytes", registry=self.registry)
        self._collector, self._node_id = collector, node_id
        self.registry.register(collector)
        self.loop_lag = LoopLag("rockstate_node", self.registry)  # started by the node, on its loop
        self._http: MetricsHTTPServer | None = None

    async def figures(self, msg: p.NodeFigures, conn: object) -> dict:
        """Memory, disk and RocksDB figures and the clients' requests so far (``RequestFigures.load``), for the
        coordinator's status page (the disk walk and the RocksDB properties, O(P), off the event loop)."""
        c = self._collector
        return {"rss_bytes": rss_bytes(), "memory_limit_bytes": c.memory_bytes, "rocksdb": await asyncio.to_thread(rocksdb_figures, c.store_of()),
                "disk": await asyncio.to_thread(disk_figures, c.data_dir),
                "loop_lag_max_seconds": self.loop_lag.worst,
                "gc_seconds": self.loop_lag.gc_total, "gc_pause_max_seconds": self.loop_lag.worst_gc, "load": self.requests.load()}

    async def identity(self, msg: p.NodeIdentity, conn: object) -> str | None:
        return self._node_id()

    def timed(self, handlers: dict) -> dict:
        """The same handlers, each counted and timed."""
        return {cls: self._wrap(cls.op, handler) for cls, handler in handlers.items()}

    def _wrap(self, op: str, handler: Callable[[object, object], Awaitable[object]]) -> Callable[[object, object], Awaitable[object]]:
        observe, failed = self.requests.recorder(op), self.failures.labels(op)

        @wraps(handler)
        async def timed(msg: object, conn: object) -> object:
            start = time.perf_counter()
            try:
                result = await handler(msg, conn)
            except BaseException:
                failed.inc()
                raise
            observe(time.perf_counter() - start)
            return result

        return timed

    def serve(self, host: str, port: int, security: Security | None = None) -> int:
        """Expose /metrics over HTTP (HTTPS with ``security``'s certificate), behind its HTTP credential
        (``Security.http_refusal``); returns the bound port."""
        self._http = MetricsHTTPServer((host, port), self.registry, security or Security())
        threading.Thread(target=self._http.serve_forever, name="metrics-http", daemon=True).start()
        return self._http.server_port

    def text(self) -> str:
        return generate_latest(self.registry).decode()

    def close(self) -> None:
        self.loop_lag.stop()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None


class MetricsHTTPServer(ThreadingHTTPServer):
    """A node's /metrics port: GET /metrics (or /) with the HTTP credential, in a thread per request; TLS when the
    node has a certificate (the handshake in the request's thread, so a slow client holds up no other)."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], registry: CollectorRegistry, security: Security) -> None:
        self.registry, self.security = registry, security
        super().__init__(address, _MetricsHandler)
        if security.server_ssl is not None:
            self.socket = security.server_ssl.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that went away, a failed TLS handshake: nothing to print on the node's stderr


class _MetricsHandler(BaseHTTPRequestHandler):
    server: MetricsHTTPServer
    timeout = 10  # seconds a client may take to send its request (and to finish a TLS handshake)

    def setup(self) -> None:
        super().setup()  # the timeout
        if isinstance(self.connection, ssl.SSLSocket):
            self.connection.do_handshake()

    def do_GET(self) -> None:  # noqa: N802 -- http.server's name
        refusal = self.server.security.http_refusal(self.headers.get("Authorization", ""))
        if refusal is not None:
            status, text, headers = refusal
            self._answer(status, text.encode(), "text/plain; charset=utf-8", headers)
        elif self.path.split("?", 1)[0] in ("/metrics", "/"):
            self._answer(200, generate_latest(self.server.registry), CONTENT_TYPE_LATEST)
        else:
            self._answer(404, b"not found: GET /metrics\n", "text/plain; charset=utf-8")

    def _answer(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 -- no access log on stderr
        pass
