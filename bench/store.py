"""Embedded store vs raw rocksdict on the same keys: N keys x 100-byte values, per key kind.

Per key kind (ints in order and in random order, 36-character UUID strings,
(tenant id, int) tuples) both
sides write and read the same keys in batches of BATCH. Raw rocksdict is one
DB written the way a user of it would: the key as bytes (its text, a tuple's
parts joined by ':'), the value as it is, one WriteBatch per batch and one
multi-get per batch. rockstate at P partitions encodes keys and values
(msgpack), hashes keys to partitions the Spark way and writes one WriteBatch
per partition, from ``put_many(dict)`` and ``get_many(list)``. All three
engines are open at once and take turns run by run, and the cost is the
calling thread's CPU time (a shared machine's load swings wall times by 2x
within a minute; wall-clock ratios are printed below the table). Medians of
REPEAT runs; ratio = ours / raw (goal: <= 1.3), and each kind's cost against
int keys in random order on the same engine (goal: <= 1.2: random ints are the
fair comparison, as UUIDs and the benches' tuples arrive in random order too;
sequential ints' rows show what RocksDB saves on keys in order).

The floor under P=16 (``RawSplit``): raw rocksdict with one DB per partition,
each batch split the way rockstate's hash splits it, one WriteBatch and one
multi-get per DB -- what RocksDB costs once a batch is spread over 16 DBs
(cold memtables and per-write costs), so ``rockstate P=16 / floor`` is the
part rockstate's own code adds.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))

from rocksdict import Options, Rdict, WriteBatch  # noqa: E402

import rockstate  # noqa: E402
from common import COMPARED_KINDS, flat_key, make_keys, print_table  # noqa: E402
from rockstate.keys.scalar import partition_of  # noqa: E402

N = int(os.environ.get("BENCH_KEYS", 200_000))
BATCH = 1000
REPEAT = 3
PARTITIONS = (1, 16)
VALUE = os.urandom(100)


class Raw:
    """Raw rocksdict, one DB, written the way its user would."""

    def __init__(self, root: str, keys: list) -> None:
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        self.db = Rdict(os.path.join(root, "raw"), opts)
        flat = list(map(flat_key, keys))
        self.batches = [flat[s:s + BATCH] for s in range(0, len(flat), BATCH)]

    def put(self) -> None:
        for batch in self.batches:
            wb = WriteBatch(raw_mode=True)
            for k in batch:
                wb.put(k, VALUE)
            self.db.write(wb)

    def get(self) -> None:
        for batch in self.batches:
            assert self.db.get(batch)[-1] == VALUE

    def close(self) -> None:
        self.db.close()


class RawSplit:
    """The floor under rockstate at P partitions: raw rocksdict, one DB per partition, each batch split by the
    keys' partitions (as rockstate hashes them) into one WriteBatch and one multi-get per DB: what RocksDB itself
    costs once a batch is spread over P DBs, with none of rockstate's encoding, hashing or grouping in the timing."""

    def __init__(self, root: str, keys: list, partitions: int) -> None:
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        self.dbs = [Rdict(os.path.join(root, f"raw{partitions}-{p}"), opts) for p in range(partitions)]
        of = [partition_of(k, partitions) for k in keys]
        flat = list(map(flat_key, keys))
        self.batches = []
        for s in range(0, len(flat), BATCH):
            split: dict[int, list[bytes]] = {}
            for k, p in zip(flat[s:s + BATCH], of[s:s + BATCH]):
                split.setdefault(p, []).append(k)
            self.batches.append([(self.dbs[p], ks) for p, ks in split.items()])

    def put(self) -> None:
        for batch in self.batches:
            for db, ks in batch:
                wb = WriteBatch(raw_mode=True)
                for k in ks:
                    wb.put(k, VALUE)
                db.write(wb)

    def get(self) -> None:
        for batch in self.batches:
            for db, ks in batch:
                assert db.get(ks)[-1] == VALUE

    def close(self) -> None:
        for db in self.dbs:
            db.close()


class Ours:
    """rockstate embedded at P partitions: put_many(dict), get_many(list)."""

    def __init__(self, root: str, keys: list, partitions: int) -> None:
        self.rs = rockstate.open(os.path.join(root, f"ours{partitions}"), partitions=partitions, memory_bytes=512 << 20)
        self.state = self.rs.value_state("bench", create=True)  # defined before the clock starts
        self.puts = [dict.fromkeys(keys[s:s + BATCH], VALUE) for s in range(0, len(keys), BATCH)]
        self.gets = [keys[s:s + BATCH] for s in range(0, len(keys), BATCH)]

    def put(self) -> None:
        for batch in self.puts:
            self.state.put_many(batch)

    def get(self) -> None:
        for batch in self.gets:
            assert self.state.get_many(batch)[-1] == VALUE

    def close(self) -> None:
        self.rs.close()


def timed_alternating(engines: list) -> list[dict[str, float]]:
    """Per engine, the medians of REPEAT runs of put and of get: the calling thread's CPU seconds ("put",
    "get": RocksDB's foreground work, memtable inserts, WAL writes and reads, runs in it; its background
    flushes and compactions do not) and wall seconds ("put_wall", "get_wall"). The engines take turns run by
    run, so a swing in the machine's load hits them alike."""
    runs: list[dict[str, list[float]]] = [{} for _ in engines]
    for work in ("put", "get"):
        for _ in range(REPEAT):
            for engine, times in zip(engines, runs):
                wall, cpu = time.perf_counter(), time.thread_time()
                getattr(engine, work)()
                times.setdefault(work, []).append(time.thread_time() - cpu)
                times.setdefault(work + "_wall", []).append(time.perf_counter() - wall)
    return [{name: statistics.median(values) for name, values in times.items()} for times in runs]


def main() -> None:
    rows, per_kind, wall, floor = [], {}, [], []
    for kind in COMPARED_KINDS:
        keys = make_keys(kind, N)
        root = tempfile.mkdtemp(prefix="rockstate-bench-")
        engines = [Raw(root, keys), *(Ours(root, keys, partitions) for partitions in PARTITIONS), RawSplit(root, keys, PARTITIONS[-1])]
        try:
            raw, *ours, split = timed_alternating(engines)
        finally:
            for engine in engines:
                engine.close()
            shutil.rmtree(root, ignore_errors=True)
        per_kind[kind, "raw"] = raw
        raw_int = per_kind["int_random", "raw"]
        rows.append([f"{kind}: raw rocksdict, 1 DB", raw["put"] / N * 1e9, raw["get"] / N * 1e9, 1.0, 1.0,
                     raw["put"] / raw_int["put"], raw["get"] / raw_int["get"]])
        for partitions, times in zip(PARTITIONS, ours):
            per_kind[kind, partitions] = times
            vs_int = per_kind["int_random", partitions]
            rows.append([f"{kind}: rockstate P={partitions}", times["put"] / N * 1e9, times["get"] / N * 1e9,
                         times["put"] / raw["put"], times["get"] / raw["get"], times["put"] / vs_int["put"], times["get"] / vs_int["get"]])
        rows.append([f"{kind}: floor, raw rocksdict, {PARTITIONS[-1]} DBs", split["put"] / N * 1e9, split["get"] / N * 1e9,
                     split["put"] / raw["put"], split["get"] / raw["get"], "", ""])
        floor.append(f"{kind} {ours[-1]['put'] / split['put']:.2f}/{ours[-1]['get'] / split['get']:.2f}")
        wall.append(f"{kind} {ours[-1]['put_wall'] / raw['put_wall']:.2f}/{ours[-1]['get_wall'] / raw['get_wall']:.2f}")
    print_table(
        f"store: {N:,} keys x 100-byte values per key kind, batches of {BATCH:,}; the calling thread's CPU, median of {REPEAT},"
        f" engines taking turns run by run (load {os.getloadavg()[0]:.1f}; goals: ratio to raw <= 1.3; to int keys in random order <= 1.2)",
        ["keys: engine", "put_many ns/key", "get_many ns/key", "put/raw", "get/raw", "put/int_random", "get/int_random"],
        rows,
    )
    print(f"wall-clock ratio to raw at P={PARTITIONS[-1]}, put/get: " + ", ".join(wall))
    print(f"rockstate P={PARTITIONS[-1]} against its floor (raw rocksdict, the same batches split over {PARTITIONS[-1]} DBs), "
          "put/get: " + ", ".join(floor))


if __name__ == "__main__":
    main()
