"""Embedded store vs raw rocksdict on the same keys: N keys x 100-byte values, per key kind.

Per key kind (ints in order and in random order, 36-character UUID strings,
(tenant id, int) tuples) both
sides write and read the same keys in batches of BATCH. Raw rocksdict is one
DB written the way a user of it would: the key as bytes (its text, a tuple's
parts joined by ':'), the value as it is, one WriteBatch per batch and one
multi-get per batch. rockstate at P partitions encodes keys and values
(msgpack), hashes keys to partitions the Spark way and writes one WriteBatch
per partition, from ``put_many(dict)`` and ``get_many(list)``. All three
engines are open at once and take turns run by run (a shared machine's load
swings by 2x within a minute). Medians of REPEAT runs; ratio = ours / raw (goal: <= 1.3), and each kind's cost against
int keys in random order on the same engine (goal: <= 1.2: random ints are the
fair comparison, as UUIDs and the benches' tuples arrive in random order too;
sequential ints' rows show what RocksDB saves on keys in order).
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


class Ours:
    """rockstate embedded at P partitions: put_many(dict), get_many(list)."""

    def __init__(self, root: str, keys: list, partitions: int) -> None:
        self.rs = rockstate.open(os.path.join(root, f"ours{partitions}"), partitions=partitions, memory_bytes=512 << 20)
        self.state = self.rs.value_state("bench")
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


def timed_alternating(engines: list) -> list[tuple[float, float]]:
    """(put, get) seconds of each engine, medians of REPEAT runs; the engines take turns run by run, so a
    swing in the machine's load hits them alike."""
    puts: list[list[float]] = [[] for _ in engines]
    gets: list[list[float]] = [[] for _ in engines]
    for times, work in ((puts, "put"), (gets, "get")):
        for _ in range(REPEAT):
            for engine, runs in zip(engines, times):
                start = time.perf_counter()
                getattr(engine, work)()
                runs.append(time.perf_counter() - start)
    return [(statistics.median(p), statistics.median(g)) for p, g in zip(puts, gets)]


def main() -> None:
    rows, per_kind = [], {}
    for kind in COMPARED_KINDS:
        keys = make_keys(kind, N)
        root = tempfile.mkdtemp(prefix="rockstate-bench-")
        engines = [Raw(root, keys), *(Ours(root, keys, partitions) for partitions in PARTITIONS)]
        try:
            (raw_put, raw_get), *ours = timed_alternating(engines)
        finally:
            for engine in engines:
                engine.close()
            shutil.rmtree(root, ignore_errors=True)
        per_kind[kind, "raw"] = raw_put, raw_get
        raw_int = per_kind["int_random", "raw"]
        rows.append([f"{kind}: raw rocksdict, 1 DB", raw_put / N * 1e9, raw_get / N * 1e9, 1.0, 1.0,
                     raw_put / raw_int[0], raw_get / raw_int[1]])
        for partitions, (put_t, get_t) in zip(PARTITIONS, ours):
            per_kind[kind, partitions] = put_t, get_t
            vs_int = per_kind["int_random", partitions]
            rows.append([f"{kind}: rockstate P={partitions}", put_t / N * 1e9, get_t / N * 1e9, put_t / raw_put, get_t / raw_get,
                         put_t / vs_int[0], get_t / vs_int[1]])
    load = os.getloadavg()[0]
    print_table(
        f"store: {N:,} keys x 100-byte values per key kind, batches of {BATCH:,}, median of {REPEAT}, engines taking turns"
        f" run by run (load {load:.1f}; goals: ratio to raw <= 1.3; to int keys in random order <= 1.2)",
        ["keys: engine", "put_many ns/key", "get_many ns/key", "put/raw", "get/raw", "put/int_random", "get/int_random"],
        rows,
    )


if __name__ == "__main__":
    main()
