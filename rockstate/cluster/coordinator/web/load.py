"""Each node's throughput and latency over the last minutes, from the nodes' own counters (no Prometheus).

A node's ``NodeFigures`` answer carries ``load``: its clients' requests, their seconds, their latency
buckets and the keys read and written, all counted since it started (``node/metrics.py``,
``RequestFigures.load``). ``LoadHistory`` keeps a ring of those counters per node, a sample at most every
``SAMPLE_EVERY`` seconds and none older than ``WINDOW``; a rate is the difference of two neighbours.
The leader samples on its own (``ClusterAnswers.sample_load``), so the graphs cover the minutes before
anyone opened the page. A node's answer is checked before it is kept: anything malformed (an older node
has no ``load``) is dropped, never shown; a counter that went down (the node restarted) starts the series anew.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Iterable, NamedTuple

SAMPLE_EVERY = 5.0  # seconds between two kept samples of a node
WINDOW = 300.0  # seconds of history kept and served
SAMPLES = int(WINDOW / SAMPLE_EVERY) + 2  # the ring's bound, whatever the clock does
MAX_BUCKETS = 64  # more latency buckets than any node sends: refused


class Sample(NamedTuple):
    at: float  # the coordinator's monotonic clock
    requests: int
    seconds: float
    keys_read: int
    keys_written: int
    bounds: tuple[float, ...]
    buckets: tuple[int, ...]


def _count(value: object) -> bool:
    return type(value) is int and value >= 0


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and type(value) is not bool and math.isfinite(value) and value >= 0


def parse(at: float, load: object) -> Sample | None:
    """A node's ``load`` as a sample; None when it is not one (missing, a wrong type, a negative or infinite
    number, buckets that do not fit their bounds)."""
    if not isinstance(load, dict):
        return None
    requests, seconds, keys_read, keys_written = (load.get(k) for k in ("requests", "seconds", "keys_read", "keys_written"))
    bounds, buckets = load.get("bounds"), load.get("buckets")
    if not (_count(requests) and _count(keys_read) and _count(keys_written) and _number(seconds)):
        return None
    if not (isinstance(bounds, list) and isinstance(buckets, list) and len(buckets) == len(bounds) + 1 <= MAX_BUCKETS):
        return None
    if not all(_number(b) and b > 0 for b in bounds) or bounds != sorted(bounds):
        return None
    if not all(_count(n) for n in buckets) or sum(buckets) != requests:
        return None
    return Sample(at, requests, float(seconds), keys_read, keys_written, tuple(bounds), tuple(buckets))  # type: ignore[arg-type]


def _quantile(q: float, bounds: tuple[float, ...], counts: list[int]) -> float | None:
    """The bound of the bucket that holds the ``q`` quantile (None: above every bound, or no requests)."""
    total = sum(counts)
    if not total:
        return None
    seen = 0
    for bound, n in zip(bounds, counts):
        seen += n
        if seen >= q * total:
            return bound
    return None


def rate(a: Sample, b: Sample) -> dict | None:
    """What a node did between two samples, per second; None if a counter went down (it restarted)."""
    dt = b.at - a.at
    diffs = [b.requests - a.requests, b.keys_read - a.keys_read, b.keys_written - a.keys_written]
    if dt <= 0 or min(diffs) < 0 or b.seconds < a.seconds or a.bounds != b.bounds:
        return None
    counts = [y - x for x, y in zip(a.buckets, b.buckets)]
    if min(counts) < 0:
        return None
    requests, keys_read, keys_written = diffs
    return {"at": b.at, "seconds": round(dt, 3), "requests_per_s": round(requests / dt, 2),
            "keys_read_per_s": round(keys_read / dt, 2), "keys_written_per_s": round(keys_written / dt, 2),
            "mean_latency_s": round((b.seconds - a.seconds) / requests, 6) if requests else None,
            "p99_latency_s": _quantile(0.99, b.bounds, counts)}


class LoadHistory:
    def __init__(self) -> None:
        self.rings: dict[str, deque[Sample]] = {}

    def record(self, at: float, figures: dict[str, dict | None]) -> None:
        """Keep each node's sample from its figures' ``load``, unless its last one is younger than SAMPLE_EVERY."""
        for node_id, answer in figures.items():
            sample = parse(at, answer.get("load") if isinstance(answer, dict) else None)
            if sample is None:
                continue
            ring = self.rings.setdefault(node_id, deque(maxlen=SAMPLES))
            if ring and at - ring[-1].at < SAMPLE_EVERY * 0.9:  # a little early is fine: the sampler's sleeps drift
                continue
            ring.append(sample)

    def document(self, now: float, members: Iterable[str]) -> dict:
        """Per member, its rates over the last WINDOW seconds, oldest first, each ``at`` as seconds before now.
        Nodes no longer members are forgotten (the dict stays as large as the membership)."""
        members = set(members)
        for gone in set(self.rings) - members:
            del self.rings[gone]
        nodes = {}
        for node_id, ring in sorted(self.rings.items()):
            while ring and now - ring[0].at > WINDOW:
                ring.popleft()
            points = [r for a, b in zip(ring, list(ring)[1:]) if (r := rate(a, b)) is not None]
            nodes[node_id] = [{**r, "at": round(r["at"] - now, 1)} for r in points]
        return {"window_seconds": WINDOW, "sample_every_seconds": SAMPLE_EVERY, "nodes": nodes}
