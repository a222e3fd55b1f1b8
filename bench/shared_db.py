"""What would a node's partitions gain from sharing one RocksDB? (issue 33)

A request's keys on a node become one piece per partition; today each piece is its own RocksDB
write to its partition's DB. Side by side in one run, the same pieces written three ways, with
rockstate's own options (shared block cache and write-buffer manager, ``store/resources.py``):

- one DB per partition, a WriteBatch each (rockstate's layout);
- one DB with a column family per partition, one WriteBatch for the request;
- one DB, one column family, a 2-byte partition prefix on every key (Flink's key groups), one WriteBatch.

Shapes: a 5,000-key batch on 3 nodes at P=16 (5 pieces of 333 keys per node), P=271 (90 of 18)
and P=1024 (341 of 5); 36-byte UUID keys, 100-byte values; microseconds per request, the median
of BENCH_SHARED_ROUNDS (60), and the ratio of today's layout to each.

    .venv/bin/python bench/shared_db.py
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(__file__))

from common import print_table  # noqa: E402
from rocksdict import Rdict, WriteBatch  # noqa: E402

from rockstate.store.resources import Resources  # noqa: E402

ROUNDS = int(os.environ.get("BENCH_SHARED_ROUNDS", "60"))
SHAPES = [(16, 5, 333), (271, 90, 18), (1024, 341, 5)]  # P, pieces per node, keys per piece
VALUE = os.urandom(100)


def _pieces(n: int, k: int) -> list[list[bytes]]:
    return [[str(uuid.uuid4()).encode() for _ in range(k)] for _ in range(n)]


def measure(root: str, n: int, k: int) -> dict[str, float]:
    res = Resources(64 << 20)
    dbs = [Rdict(os.path.join(root, f"p{i}"), res.options(), column_families={"s": res.options()}) for i in range(n)]
    per_db = [(db, db.get_column_family_handle("s")) for db in dbs]
    cf_db = Rdict(os.path.join(root, "cf"), res.options(), column_families={f"p{i}": res.options() for i in range(n)})
    cfs = [cf_db.get_column_family_handle(f"p{i}") for i in range(n)]
    prefix_db = Rdict(os.path.join(root, "prefix"), res.options(), column_families={"s": res.options()})
    prefix_handle = prefix_db.get_column_family_handle("s")

    def many(pieces: list[list[bytes]]) -> None:
        for (db, handle), keys in zip(per_db, pieces):
            batch = WriteBatch(raw_mode=True)
            for key in keys:
                batch.put(key, VALUE, handle)
            db.write(batch)

    def families(pieces: list[list[bytes]]) -> None:
        batch = WriteBatch(raw_mode=True)
        for handle, keys in zip(cfs, pieces):
            for key in keys:
                batch.put(key, VALUE, handle)
        cf_db.write(batch)

    def prefixed(pieces: list[list[bytes]]) -> None:
        batch = WriteBatch(raw_mode=True)
        for i, keys in enumerate(pieces):
            group = i.to_bytes(2, "big")
            for key in keys:
                batch.put(group + key, VALUE, prefix_handle)
        prefix_db.write(batch)

    times: dict[str, list[float]] = {"many": [], "families": [], "prefixed": []}
    try:
        for _ in range(ROUNDS):  # interleaved: the machine's load falls on each alike
            for name, write in (("many", many), ("families", families), ("prefixed", prefixed)):
                pieces = _pieces(n, k)
                start = time.perf_counter()
                write(pieces)
                times[name].append(time.perf_counter() - start)
    finally:
        for db in [*dbs, cf_db, prefix_db]:
            db.close()
    return {name: statistics.median(t) * 1e6 for name, t in times.items()}


def main() -> None:
    rows = []
    for P, n, k in SHAPES:
        root = tempfile.mkdtemp(prefix="rockstate-bench-shared-")
        try:
            us = measure(root, n, k)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        rows.append([f"P={P}: {n} x {k} keys", us["many"], us["many"] / n, us["families"], us["many"] / us["families"],
                     us["prefixed"], us["many"] / us["prefixed"]])
    print_table("one request's pieces on a node: a DB per partition (today) against one shared DB; µs per request, "
                "and today's time over each",
                ["shape", "DB each µs", "µs/piece", "one DB, CF each µs", "x gain", "one DB, key groups µs", "x gain"],
                rows)


if __name__ == "__main__":
    main()
