"""Embedded store vs raw rocksdict on the same work: 1M keys, 100-byte values.

Both sides write and read in batches of BATCH keys over the same number of
RocksDB instances. Raw rocksdict writes 8-byte keys and raw value bytes, the
key's instance picked by modulo; rockstate encodes keys and values (msgpack),
hashes keys to partitions the Spark way, and writes one WriteBatch per
partition. Medians of REPEAT runs; ratio = ours / raw at the same P.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))

from rocksdict import Options, Rdict, WriteBatch  # noqa: E402

import rockstate  # noqa: E402
from common import median_time, print_table  # noqa: E402

N = int(os.environ.get("BENCH_KEYS", 1_000_000))
BATCH = 10_000
REPEAT = 3
VALUE = os.urandom(100)


def raw_rocksdict(root: str, partitions: int) -> tuple[float, float]:
    """The same work by hand: key i goes to instance i % partitions, one WriteBatch / multi-get each."""
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    dbs = [Rdict(os.path.join(root, f"raw{partitions}-{p}"), opts) for p in range(partitions)]
    batches = []
    for start in range(0, N, BATCH):
        groups = [[] for _ in range(partitions)]
        for i in range(start, min(start + BATCH, N)):
            groups[i % partitions].append(i.to_bytes(8, "big"))
        batches.append(groups)

    def put():
        for groups in batches:
            for db, keys in zip(dbs, groups):
                wb = WriteBatch(raw_mode=True)
                for k in keys:
                    wb.put(k, VALUE)
                db.write(wb)

    def get():
        for groups in batches:
            for db, keys in zip(dbs, groups):
                assert db.get(keys)[-1] == VALUE

    put_t, get_t = median_time(put, REPEAT), median_time(get, REPEAT)
    for db in dbs:
        db.close()
    return put_t, get_t


def ours(root: str, partitions: int) -> tuple[float, float]:
    rs = rockstate.open(os.path.join(root, f"ours{partitions}"), partitions=partitions, memory_bytes=512 << 20)
    state = rs.value_state("bench")
    batches = [range(s, min(s + BATCH, N)) for s in range(0, N, BATCH)]

    def put():
        for keys in batches:
            state.put_many(zip(keys, [VALUE] * len(keys)))

    def get():
        for keys in batches:
            assert state.get_many(keys)[-1] == VALUE

    put_t, get_t = median_time(put, REPEAT), median_time(get, REPEAT)
    rs.close()
    return put_t, get_t


def main() -> None:
    root = tempfile.mkdtemp(prefix="rockstate-bench-")
    try:
        rows = []
        for partitions in (1, 8, 128):
            raw_put, raw_get = raw_rocksdict(root, partitions)
            put_t, get_t = ours(root, partitions)
            rows.append([f"raw rocksdict x{partitions}", raw_put / N * 1e9, raw_get / N * 1e9, 1.0, 1.0])
            rows.append([f"rockstate P={partitions}", put_t / N * 1e9, get_t / N * 1e9, put_t / raw_put, get_t / raw_get])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print_table(
        f"store: {N:,} keys x 100-byte values, batches of {BATCH:,}, median of {REPEAT} (goal: ratio <= 1.3)",
        ["engine", "put_many ns/key", "get_many ns/key", "put ratio", "get ratio"],
        rows,
    )


if __name__ == "__main__":
    main()
