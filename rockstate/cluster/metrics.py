"""A node's Prometheus metrics: operations, latency, keys, partitions owned."""

from __future__ import annotations

import time
from functools import wraps

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import start_http_server

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)


class NodeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        # one observation per request on the hot path: the histogram's _count is the successes
        self.failures = Counter("rockstate_node_request_failures", "Requests that failed, by operation", ["op"], registry=self.registry)
        self.latency = Histogram("rockstate_node_request_seconds", "Latency of successful requests, by operation", ["op"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.keys_written = Counter("rockstate_node_keys_written", "Keys written (puts and deletes)", registry=self.registry)
        self.keys_read = Counter("rockstate_node_keys_read", "Keys read", registry=self.registry)
        self.partitions = Gauge("rockstate_node_partitions", "Partitions owned", registry=self.registry)
        self._http = None

    def timed(self, handlers: dict) -> dict:
        """The same handlers, each counted and timed."""
        return {cls: self._wrap(cls.op, handler) for cls, handler in handlers.items()}

    def _wrap(self, op: str, handler):
        observe, failed = self.latency.labels(op).observe, self.failures.labels(op)

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
