"""Shared by the benchmarks: repeat, take medians, print a table with ratios."""

from __future__ import annotations

import random
import statistics
import time
import uuid
from typing import Callable


def median_time(fn: Callable[[], object], repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def print_table(title: str, header: list[str], rows: list[list[object]]) -> None:
    cells = [header] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(f"\n{title}")
    for n, row in enumerate(cells):
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            print("  ".join("-" * w for w in widths))


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}" if value < 100 else f"{value:,.0f}"
    return str(value)


# -- the keys every benchmark runs: ints, 36-character UUID strings, a two-column tuple ----------

KEY_KINDS = ("int", "uuid", "tuple")


def make_keys(kind: str, n: int, seed: int = 42) -> list:
    """n distinct keys of one kind: 0..n-1; random UUIDs as strings; (tenant id, int) pairs."""
    if kind == "int":
        return list(range(n))
    if kind == "uuid":
        rng = random.Random(seed)
        return [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(n)]
    if kind == "tuple":
        return [(f"tenant-{i % 1000:04d}", i) for i in range(n)]
    raise ValueError(f"unknown key kind {kind!r}; one of {KEY_KINDS}")


def flat_key(key) -> bytes:
    """The same key as a Redis (or raw RocksDB) user writes it: its text, a tuple's parts joined by ':'."""
    if isinstance(key, tuple):
        return ":".join(map(str, key)).encode()
    return str(key).encode()
