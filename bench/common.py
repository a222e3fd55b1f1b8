"""Shared by the benchmarks: repeat, take medians, print a table with ratios."""

from __future__ import annotations

import hashlib
import statistics
import time
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

# The benches that compare key kinds' costs (store, remote, keys) add ints in random order: RocksDB serves
# sequential ints from neighbouring blocks, so "UUID vs int" would otherwise measure key order, not key type.
COMPARED_KINDS = ("int_random", "int", "uuid", "tuple")

_PRIME = 2_147_483_647  # i -> i * _SCRAMBLE mod _PRIME is one-to-one below _PRIME: distinct ints in random order
_SCRAMBLE = 2_654_435_761 % _PRIME


def key_of(kind: str, i: int):
    """The i-th key of a kind: i itself; i scrambled (distinct ints in random order); a random-looking
    36-character UUID string (md5 of i); (tenant id, i)."""
    if kind == "int":
        return i
    if kind == "int_random":
        return i * _SCRAMBLE % _PRIME
    if kind == "uuid":  # Spark SQL makes the same: see bench/bulk_load.py
        h = hashlib.md5(str(i).encode()).hexdigest()
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    if kind == "tuple":
        return (f"tenant-{i % 1000:04d}", i)
    raise ValueError(f"unknown key kind {kind!r}; one of {COMPARED_KINDS}")


def make_keys(kind: str, n: int, start: int = 0) -> list:
    """Keys start..start+n-1 of a kind (distinct)."""
    return [key_of(kind, i) for i in range(start, start + n)]


def flat_key(key) -> bytes:
    """The same key as a Redis (or raw RocksDB) user writes it: its text, a tuple's parts joined by ':'."""
    if isinstance(key, tuple):
        return ":".join(map(str, key)).encode()
    return str(key).encode()
