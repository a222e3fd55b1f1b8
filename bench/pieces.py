"""What a partition piece costs on the replicated write path, stage by stage, in one process (issue 33's floor).

A batch put reaches each node as one request holding a piece per partition it touches: at P=1024 a 5,000-key
batch on 3 nodes is ~340 pieces of ~5 keys per node, at P=16 ~6 pieces of ~280. Each piece pays its own
request-id record and sequence number (what lets a partition move and be written exactly once on its own), its
log entry, its place in the ``ReplicaApply``, its apply on the backup and its acknowledgement. This runs that
path for one node's share of a 5,000-key batch (1,666 UUID keys, 100-byte values) with no network and no other
process: a primary ``Store`` and ``Primaries``, a backup ``Store`` and ``Backups``, the ``ReplicaApply`` through
msgpack both ways and its check, as the nodes do it, in order:

- write: ``Store.write_groups`` with a request id (the pieces staged, one RocksDB write, each shipped), and the
  request's wait for its acknowledgement set up (it queues the pieces for the senders);
- outgoing: the sender's ``Primaries.outgoing``; msgpack: the message out and in, the answers too;
- check: ``ReplicaApply.from_wire``; apply: ``Backups._apply``; answered: ``Primaries.answered``.

Medians over BATCHES batches, ms a batch, and what the batch costs per piece; ratio to P=16. What grows with P
here is Python and RocksDB entries per piece, not bytes: the cluster's put at P=1024 cannot be cheaper than this
(the nodes' processes, the network and the client come on top).

The floor under it (``_rocksdb``): the same batches' entries written by RocksDB alone, one WriteBatch into a
primary's DB and one into a backup's, with each piece's request id and sequence number and without them. What
the records cost RocksDB grows with the pieces, so no per-partition path, however little Python it ran, could keep
P=1024's keys/s closer to P=16's than that column's ratio.

Then a single put's two stores (item 2's p50): the primary's ``write_groups`` of one key and the backup's apply of
it, in a loop (warm), and with CACHE_BYTES of memory touched before each (cold: what the other processes on these
cores do between two of a node's requests, a client's, the other nodes'). A replicated single put runs the path
of three processes, each woken for one request.

    .venv/bin/python bench/pieces.py [--partitions 16,271,1024]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time

import msgpack
import numpy as np
from rocksdict import Rdict, WriteBatch

sys.path.insert(0, os.path.dirname(__file__))

from common import key_of, print_table  # noqa: E402

from rockstate.cli.servers import GC_THRESHOLDS  # noqa: E402
from rockstate.cluster import protocol as p  # noqa: E402
from rockstate.cluster.replication.backup import Backups  # noqa: E402
from rockstate.cluster.replication.primary import Primaries  # noqa: E402
from rockstate.config import StoreConfig  # noqa: E402
from rockstate.ops import PUT_MANY, RAW_PUT, RAW_PUT_MANY  # noqa: E402
from rockstate.store import StateSpec, Store, keygroups  # noqa: E402
from rockstate.store.partition import REPLICATION, SEQ, SEQ_KEY  # noqa: E402
from rockstate.store.requests import REQUESTS, WRITTEN  # noqa: E402
from rockstate.store.resources import Resources  # noqa: E402

CACHE_BYTES = 64 << 20  # more than the machine's caches
SINGLES = 400
NODES = 3
KEYS = 5000 // NODES  # a node's share of a 5,000-key batch
BATCHES = int(os.environ.get("BENCH_PIECES_BATCHES", 40))
VALUE = os.urandom(100)
STAGES = ["write", "outgoing", "msgpack", "check", "apply", "answered"]


def _store(root: str, name: str, partitions: int, mine: int) -> Store:
    store = Store(os.path.join(root, name), StoreConfig(partitions=partitions), owned=range(mine),
                  reserved=("_requests", "_replication"))
    store.define_state(StateSpec("scale", "value"))
    for pid in range(mine):
        store.open_partition(pid)
    return store


async def _run(partitions: int, root: str) -> dict[str, float]:
    mine = -(-partitions // NODES)  # the partitions one node is primary of
    primary, backup = _store(root, "primary", partitions, mine), _store(root, "backup", partitions, mine)
    try:
        primaries = Primaries(lambda: primary, lambda *a: None, lambda *a: None, lambda: 1.0)
        primaries.on_loop()
        backups = Backups(lambda: backup)
        for pid in range(mine):
            primaries.lead(pid, 2, ("B",), ("B",), "sync", lambda pid, seq: [])
            backup.partition(pid).backup = True
            backups.configure(pid, 2, sole=True)  # its only backup, as with the default backup_count: no tail
            backups.adopt(pid, 2, 0)
        primaries.sender("B")
        keys = [key_of("uuid", i).encode() for i in range(KEYS * (BATCHES + 3))]
        times: dict[str, list[float]] = {s: [] for s in STAGES}
        for b in range(BATCHES + 3):
            groups: dict[int, list[bytes]] = {}
            for i, k in enumerate(keys[b * KEYS:(b + 1) * KEYS]):  # spread as a hash spreads them
                groups.setdefault(hash(k) % mine, []).append(k)
            pieces = [(pid, [(PUT_MANY, "scale", ks, [VALUE] * len(ks))]) for pid, ks in groups.items()]
            request = int(time.time() * 1000).to_bytes(8, "big") + os.urandom(8)
            t0 = time.perf_counter()
            primary.write_groups(pieces, request)
            waiting = asyncio.ensure_future(primaries.acknowledged([pid for pid, _ in pieces]))
            await asyncio.sleep(0)
            t2 = time.perf_counter()
            items, carried, runs = primaries.outgoing("B", False)
            t3 = time.perf_counter()
            wire = msgpack.unpackb(msgpack.packb(p.ReplicaApply(items=items, runs=runs or None).to_wire(), use_bin_type=True),
                                   raw=False, strict_map_key=False)
            t4 = time.perf_counter()
            message = p.ReplicaApply.from_wire(wire)
            t5 = time.perf_counter()
            replies = backups._apply(message.items, message.runs or [])
            t6 = time.perf_counter()
            replies = msgpack.unpackb(msgpack.packb(replies, use_bin_type=True), raw=False)
            t7 = time.perf_counter()
            primaries.answered("B", replies, carried)
            t8 = time.perf_counter()
            await waiting
            if b >= 3:  # the first batches warm up
                for stage, seconds in zip(STAGES, [t2 - t0, t3 - t2, (t4 - t3) + (t7 - t6), t5 - t4, t6 - t5, t8 - t7]):
                    times[stage].append(seconds)
        medians = {s: statistics.median(v) for s, v in times.items()}
        medians["pieces"] = float(len(groups))
        return medians
    finally:
        primary.close()
        backup.close()


def _rocksdb(partitions: int, root: str) -> tuple[float, float]:
    """The floor under ``_run``: one node's share of each batch written by RocksDB alone, as one WriteBatch into a
    primary's and a backup's DB (the nodes' options, a column family per state), ms a batch (medians): with what
    the per-partition design adds to every piece (its request id, and its sequence number) and without."""
    mine = -(-partitions // NODES)
    families = ("scale", REQUESTS, REPLICATION)
    dbs = []
    for name in ("primary", "backup"):  # each its own memory, as each node's store has (``NodeDB``)
        resources = Resources(StoreConfig(partitions=partitions).memory_bytes)
        resources.memtables(len(families) + 1)
        dbs.append(Rdict(os.path.join(root, f"raw-{name}"), resources.options(),
                         column_families={f: resources.options() for f in families}))
    try:
        handles = [[db.get_column_family_handle(f) for f in families] for db in dbs]
        keys = [key_of("uuid", i).encode() for i in range(KEYS * (BATCHES + 3))]
        times: dict[bool, list[float]] = {True: [], False: []}
        for b in range(BATCHES + 3):
            groups: dict[int, list[bytes]] = {}
            for k in keys[b * KEYS:(b + 1) * KEYS]:
                groups.setdefault(hash(k) % mine, []).append(k)
            request = os.urandom(16)
            for records in (b % 2 == 0, b % 2 == 1):  # interleaved: the DBs grow alike under both
                seconds = 0.0
                for db, (data, ids, seqs) in zip(dbs, handles):
                    batch = WriteBatch(raw_mode=True)
                    for pid, ks in groups.items():
                        prefix = keygroups.prefix(pid)
                        for k in ks:
                            batch.put(prefix + k, VALUE, data)
                        if records:
                            batch.put(prefix + request, WRITTEN, ids)
                            batch.put(prefix + SEQ_KEY, SEQ.pack(b + 1), seqs)
                    t0 = time.perf_counter()
                    db.write(batch)
                    seconds += time.perf_counter() - t0
                if b >= 3:
                    times[records].append(seconds)
        return statistics.median(times[True]) * 1e3, statistics.median(times[False]) * 1e3
    finally:
        for db in dbs:
            db.close()


def _single(root: str) -> dict[str, tuple[float, float]]:
    """P=16: (warm, cold) p50 µs of one key's write on a primary and its apply on a backup."""
    primary, backup = _store(root, "primary1", 16, 16), _store(root, "backup1", 16, 16)
    try:
        backups = Backups(lambda: backup)
        for pid in range(16):
            backup.partition(pid).backup = True
            backups.adopt(pid, 2, 0)
        junk = np.zeros(CACHE_BYTES, dtype=np.uint8)
        seqs = [0] * 16
        times: dict[tuple[str, bool], list[float]] = {}
        for i in range(4 * SINGLES):
            cold = i >= 2 * SINGLES
            if cold:
                junk += 1
            pid, key = i % 16, key_of("uuid", i).encode()
            request = int(time.time() * 1000).to_bytes(8, "big") + os.urandom(8)
            t0 = time.perf_counter()
            primary.write_groups([(pid, [(PUT_MANY, "scale", [key], [VALUE])])], request)
            t1 = time.perf_counter()
            if cold:
                junk += 1
            seqs[pid] += 1
            stored = [[RAW_PUT_MANY, "scale", [key], [VALUE]], [RAW_PUT, REQUESTS, request, WRITTEN]]  # as a primary ships it
            t2 = time.perf_counter()
            backups._apply([[pid, 2, seqs[pid], stored]])
            t3 = time.perf_counter()
            if i % (2 * SINGLES) >= SINGLES // 4:  # after a warm-up in each half
                times.setdefault(("write", cold), []).append(t1 - t0)
                times.setdefault(("apply", cold), []).append(t3 - t2)
        return {s: (statistics.median(times[s, False]) * 1e6, statistics.median(times[s, True]) * 1e6) for s in ("write", "apply")}
    finally:
        primary.close()
        backup.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--partitions", default="16,271,1024")
    args = parser.parse_args()
    ps = [int(x) for x in args.partitions.split(",") if x]
    gc.set_threshold(*GC_THRESHOLDS)  # as a node's process collects (cli/servers.py): at Python's default the collector was 40 % of a batch's RocksDB puts here
    root = tempfile.mkdtemp(prefix="rockstate-bench-pieces-")
    try:
        rows = [(P, asyncio.run(_run(P, os.path.join(root, str(P))))) for P in ps]
        floors = [(P, _rocksdb(P, os.path.join(root, f"raw{P}"))) for P in ps]
        single = _single(os.path.join(root, "single"))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = sum(rows[0][1][s] for s in STAGES)
    out = []
    for P, m in rows:
        total = sum(m[s] for s in STAGES)
        out.append([P, int(m["pieces"]), *(m[s] * 1e3 for s in STAGES), total * 1e3, total / m["pieces"] * 1e6,
                    KEYS / total, base / total])
    print_table(f"one node's share of a 5,000-key batch ({KEYS:,} UUID keys, 100-byte values) on the replicated write "
                "path in one process, ms a batch (medians); ratio of keys/s to the first P",
                ["P", "pieces", *(f"{s} ms" for s in STAGES), "all ms", "us a piece", "keys/s", "x"], out)
    (_, (base_with, base_without)), out = floors[0], []
    for (P, m), (_, (with_records, without)) in zip(rows, floors):
        total = sum(m[s] for s in STAGES) * 1e3
        out.append([P, with_records, base_with / with_records, without, base_without / without, total,
                    with_records / total])
    print_table("the floor: the same batches' entries written by RocksDB alone into a primary's and a backup's DB, ms a "
                "batch (medians), with each piece's request id and sequence number and without; x: keys/s against the "
                "first P; the share of the whole path above that is RocksDB's",
                ["P", "with records ms", "x", "without ms", "x", "path ms", "RocksDB share"], out)
    print_table(f"a single put's two stores, P=16, p50 µs: in a loop, and with {CACHE_BYTES >> 20} MB touched before each "
                "(as other processes do between a node's requests)",
                ["stage", "warm us", "cold us", "x"], [[s, w, c, c / w] for s, (w, c) in single.items()])


if __name__ == "__main__":
    main()
