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

A second table: what a node's start-up and checkpoint cost in each layout, with the column families
every written partition has (its state, ``_requests``, ``_replication``): the node's share of the
partitions created (each DB's files made and synced), opened again (a restart), and, after one
request's pieces were written, flushed and hard-linked into a RocksDB checkpoint (a DB per partition:
one checkpoint each; one DB: one checkpoint). Seconds, the median of BENCH_SHARED_COPY_ROUNDS (3).

    .venv/bin/python bench/shared_db.py
"""

from __future__ import annotations

import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(__file__))

from common import print_table  # noqa: E402
from rocksdict import Checkpoint, Rdict, WriteBatch  # noqa: E402

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


FAMILIES = ("s", "_requests", "_replication")
COPY_ROUNDS = int(os.environ.get("BENCH_SHARED_COPY_ROUNDS", "3"))


def _layouts(n: int) -> dict[str, list[tuple[str, tuple[str, ...]]]]:
    """Each layout's DBs on a node holding ``n`` partitions: (folder, column families)."""
    return {"many": [(f"p{i}", FAMILIES) for i in range(n)],
            "families": [("cf", tuple(f"{f}{i}" for i in range(n) for f in FAMILIES))],
            "prefixed": [("prefix", FAMILIES)]}


def _open_all(base: str, dbs: list[tuple[str, tuple[str, ...]]], res: Resources) -> list[Rdict]:
    return [Rdict(os.path.join(base, d), res.options(), column_families={f: res.options() for f in cfs}) for d, cfs in dbs]


def _write_and_checkpoint(opened: list, dbs: list, per_family: int, base: str) -> float:
    """Writes ``per_family`` keys into every family, then times each DB's flush and hard-link checkpoint."""
    for db, (_, cfs) in zip(opened, dbs):
        batch = WriteBatch(raw_mode=True)
        for f in cfs:
            handle = db.get_column_family_handle(f)
            for key in range(per_family):
                batch.put(key.to_bytes(4, "big") + f.encode(), VALUE, handle)
        db.write(batch)
    start = time.perf_counter()
    for i, (db, (_, cfs)) in enumerate(zip(opened, dbs)):
        for f in cfs:
            db.get_column_family(f).flush()
        Checkpoint(db).create_checkpoint(os.path.join(base, f"chk-{i}"))
    return time.perf_counter() - start


def copies(root: str, n: int, k: int) -> dict[str, dict[str, float]]:
    """Seconds to create, reopen and checkpoint a node's ``n`` partitions in each layout."""
    res = Resources(64 << 20)
    out: dict[str, dict[str, list[float]]] = {}
    for name, dbs in _layouts(n).items():
        times = out.setdefault(name, {"create": [], "reopen": [], "checkpoint": []})
        for r in range(COPY_ROUNDS):
            base = os.path.join(root, f"{name}{r}")
            start = time.perf_counter()
            opened = _open_all(base, dbs, res)
            times["create"].append(time.perf_counter() - start)
            per_family = k * n if name == "prefixed" else k  # the request's n pieces of k keys, in every family
            times["checkpoint"].append(_write_and_checkpoint(opened, dbs, per_family, base))
            for db in opened:
                db.close()
            del opened
            gc.collect()  # a column family's handle keeps its DB (and the DB's lock) until it is collected
            start = time.perf_counter()
            opened = _open_all(base, dbs, res)
            times["reopen"].append(time.perf_counter() - start)
            for db in opened:
                db.close()
            shutil.rmtree(base, ignore_errors=True)
    return {name: {m: statistics.median(t) for m, t in ms.items()} for name, ms in out.items()}


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
    rows = []
    for P, n, k in SHAPES:
        root = tempfile.mkdtemp(prefix="rockstate-bench-shared-")
        try:
            s = copies(root, n, k)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        for what in ("create", "reopen", "checkpoint"):
            many = s["many"][what]
            rows.append([f"P={P}: {n} partitions", what, many, s["families"][what], many / s["families"][what],
                         s["prefixed"][what], many / s["prefixed"][what]])
    print_table("a node's partitions created, reopened and checkpointed: a DB per partition (today) against one shared DB; "
                "seconds, and today's time over each",
                ["shape", "step", "DB each s", "one DB, CF each s", "x gain", "one DB, key groups s", "x gain"], rows)


if __name__ == "__main__":
    main()
