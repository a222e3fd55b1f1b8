"""How late a process's event loop runs what is due (issue 33), for the coordinator and every node.

A task sleeps ``INTERVAL`` and measures how far past its deadline it woke: the wait every request, heartbeat
and timer had behind whatever held the loop then (a blocking call, a long Python step, the GIL held by a thread).
A node stalled for half its lease stops serving; so the lag is exported (``<prefix>_loop_lag_seconds``, a
histogram, and ``<prefix>_loop_lag_max_seconds``, the worst since the process started) and a stall over
``STALL`` is logged.

The garbage collector's pauses are one such hold, and the one a process may tune (``serve`` in ``cli/servers.py``):
their time is counted by generation (``<prefix>_gc_seconds_total``, ``<prefix>_gc_pause_max_seconds``).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

log = logging.getLogger(__name__)

INTERVAL = 0.1  # seconds between samples: a stall shorter than this may fall between two
STALL = 0.5  # seconds of lag logged as a warning
BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class LoopLag:
    def __init__(self, prefix: str, registry: CollectorRegistry) -> None:
        """``prefix``: the role's metric prefix (``rockstate_node``, ``rockstate_coordinator``)."""
        self.histogram = Histogram(f"{prefix}_loop_lag_seconds", f"How late the event loop ran a task due (sampled every {INTERVAL:g} s)",
                                   buckets=BUCKETS, registry=registry)
        self.gauge = Gauge(f"{prefix}_loop_lag_max_seconds", "The event loop's worst lag since the process started", registry=registry)
        self.gc_seconds = Counter(f"{prefix}_gc_seconds", "Time in the garbage collector, by generation", ["generation"],
                                  registry=registry)
        self.gc_pause = Gauge(f"{prefix}_gc_pause_max_seconds", "The garbage collector's longest pause since the process started",
                              registry=registry)
        self.worst = self.worst_gc = self.gc_total = 0.0
        self._task: asyncio.Task | None = None
        self._gc_started = 0.0

    def start(self) -> None:
        """Sample from now on, on the running loop; time the collector's pauses."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="loop-lag")
            gc.callbacks.append(self._collected)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
            gc.callbacks.remove(self._collected)

    def _collected(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        pause = time.perf_counter() - self._gc_started
        self.gc_seconds.labels(str(info["generation"])).inc(pause)
        self.gc_total += pause
        if pause > self.worst_gc:
            self.worst_gc = pause
            self.gc_pause.set(pause)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + INTERVAL
            await asyncio.sleep(INTERVAL)
            self.observe(max(0.0, loop.time() - due))

    def observe(self, lag: float) -> None:
        self.histogram.observe(lag)
        if lag > self.worst:
            self.worst = lag
            self.gauge.set(lag)
        if lag > STALL:
            log.warning("the event loop stalled for %.2fs", lag)
