"""Replicated partitions: what backups cost on the write path, and what they buy at a node's death.

Side by side in one run, each a multi-process LocalCluster of 3 nodes, P=16 (BENCH_REPL_P),
heartbeat_timeout 2 s, keys 36-character UUID strings, values with a date and
a decimal amount:

- batch-1000 ``put_many`` throughput (keys/s) and single ``put`` p50/p99 (ms)
  at ``backup_count`` 0, 1 and 2 (``replication: sync``), with ratios to 0;
  then, at 0 and 1, the same for ints in random order and in order, UUID
  strings and (tenant, int) tuples, each in its own state (ints in random
  order are the fair comparison: UUIDs and tuples arrive in random order too);
- kill -9 of a node holding primaries (backup_count=1): seconds from the kill
  until every key of its partitions reads back its value again (a client
  retrying, as users' clients do), against ``heartbeat_timeout``;
- re-replication: the backup copies the kill made the coordinator create on
  the survivors (``replica_copied`` events: hard-link snapshot, its files as
  one stream on a connection of their own, open): their bytes over the
  wall-clock span from the first copy's start to the last one's end (copies run
  ``max_concurrent_migrations`` at once, so summing each copy's seconds would
  count overlapping time twice), against a plain copy of the same bytes --
  the killed node's RocksDB directory (every partition it held), copied
  on this disk from the page cache (``shutil.copytree``; no network hop, no
  process hop: a stricter reference than a copy between two hosts), after
  ``os.sync()`` (with the load's dirty pages still pending, the kernel's
  writeback throttled the copy to anywhere from 377 to 2,802 MB/s); and, as a
  second reference, the same files sent over one loopback TCP connection with
  ``sendfile`` to another process that writes them (``floors.py``): a plain
  copy between two processes. Before
  the kill BENCH_REPL_LOADED keys (1M) are written with NOTE_BYTES random
  bytes each, ~30 MB a partition that compression does not shrink: with a
  few MB a copy's fixed costs (the snapshot's flush, the copy's RocksDB
  open, a round trip per file) were the whole measure, not its rate.

Goals (issue 14): backup_count=1 keeps >= 0.7x the throughput of 0 and <=
1.5x its single-put p50; failover <= heartbeat_timeout + 0.5 s;
re-replication >= 70% of a plain copy. Medians of BENCH_REPL_ROUNDS (3).

The floor under the p50 goal, in the same run (``floors.py``): what one more
server hop costs a Python server that does nothing else -- a uvloop relay
that forwards each request to a uvloop echo server and answers once it did,
against the echo server alone. backup_count=0's p50 plus that hop is the
least any design of synchronous replication built as rockstate is could
reach.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from datetime import date
from decimal import Decimal

sys.path.insert(0, os.path.dirname(__file__))

from common import COMPARED_KINDS as KINDS, key_of, print_table  # noqa: E402
from floors import round_trip_p50_us, socket_copy_mb_s  # noqa: E402

from rockstate.local.cluster import LocalCluster  # noqa: E402
from rockstate.errors import RockstateError  # noqa: E402

ROUNDS = int(os.environ.get("BENCH_REPL_ROUNDS", "3"))
BATCHES = int(os.environ.get("BENCH_REPL_BATCHES", "40"))  # of 1000 keys, per round
PUTS = int(os.environ.get("BENCH_REPL_PUTS", "1000"))
LOADED = int(os.environ.get("BENCH_REPL_LOADED", "1000000"))  # keys written before the kill
NOTE_BYTES = 400  # random, so RocksDB's compression does not shrink what re-replication and the plain copy move
HEARTBEAT = 2.0
PARTITIONS = int(os.environ.get("BENCH_REPL_P", "16"))  # issue 33: 271 too


def value(i: int) -> dict:
    return {"amount": Decimal(i) / 100, "day": date(2026, 11, 1 + i % 28), "status": "settled"}


def loaded(i: int) -> dict:
    """The value of the i-th key written before the kill: ``value(i)`` and NOTE_BYTES that do not compress."""
    return value(i) | {"note": random.Random(i).randbytes(NOTE_BYTES)}


def cluster(root: str, backup_count: int) -> LocalCluster:
    return LocalCluster(nodes=3, partitions=PARTITIONS, root=os.path.join(root, f"bc{backup_count}"), heartbeat_timeout=HEARTBEAT,
                        backup_count=backup_count, node_memory_bytes=256 << 20)


def write_path(c: LocalCluster, kind: str = "uuid") -> tuple[float, float, float]:
    with c.connect() as rs:
        state = rs.value_state(f"orders_{kind}")
        keys = [key_of(kind, i) for i in range(BATCHES * 1000)]
        state.put_many({k: value(i) for i, k in enumerate(keys[:1000])})  # warm up
        rates = []
        for _ in range(ROUNDS):
            start = time.perf_counter()
            for b in range(BATCHES):
                state.put_many({k: value(i) for i, k in enumerate(keys[b * 1000:(b + 1) * 1000], b * 1000)})
            rates.append(BATCHES * 1000 / (time.perf_counter() - start))
        latencies = []
        for i in range(PUTS):
            start = time.perf_counter()
            state.put(keys[i], value(i))
            latencies.append(time.perf_counter() - start)
        latencies.sort()
        assert state.get(keys[-1]) == value(BATCHES * 1000 - 1) and state.get(keys[0]) == value(0)
        return statistics.median(rates), latencies[len(latencies) // 2] * 1000, latencies[int(len(latencies) * 0.99)] * 1000


def failover(c: LocalCluster) -> tuple[float, float, float, float]:
    """Kill -9 a node; seconds until its partitions serve again; re-replication, plain-copy and socket-copy MB/s."""
    with c.connect(retry_timeout=60.0) as rs:
        state = rs.value_state("orders")
        keys = [key_of("uuid", i) for i in range(LOADED)]
        for b in range(0, LOADED, 1000):  # ~30 MB per partition: re-replication's rate, not its fixed costs per copy
            state.put_many({k: loaded(b + i) for i, k in enumerate(keys[b:b + 1000])})
        victim = c.nodes()[0]
        table = rs.backend.refresh()
        lost = set(table.owned_by(victim.node_id))
        probes = {}
        for i, k in enumerate(keys):
            if rs.partition_of(k) in lost and rs.partition_of(k) not in probes:
                probes[rs.partition_of(k)] = (k, i)
        c.wait_replicated(120)
        # the reference: a plain copy of the same bytes, the node's RocksDB (every partition, primary or backup, it holds)
        sources = [os.path.join(victim.data_dir, "store", "db")]
        copy_to = tempfile.mkdtemp(prefix="rockstate-plain-copy-")
        size = sum(os.path.getsize(os.path.join(d, f)) for d in sources for f in os.listdir(d))
        os.sync()  # the load's dirty pages written back first: else the copy's speed is the writeback's
        start = time.perf_counter()
        for d in sources:
            shutil.copytree(d, os.path.join(copy_to, os.path.basename(d)))
        plain = size / (time.perf_counter() - start) / 1e6
        shutil.rmtree(copy_to)
        os.sync()
        os.makedirs(copy_to)
        socket_copy = socket_copy_mb_s([os.path.join(d, f) for d in sources for f in sorted(os.listdir(d))], copy_to)
        shutil.rmtree(copy_to)
        after = c.status()["events"][-1]["seq"]
        killed = time.perf_counter()
        c.kill_node(victim.node_id)
        for k, i in probes.values():
            assert state.get(k) == loaded(i)
        served = time.perf_counter() - killed
        c.wait_replicated(120)
        copies = [e for e in c.status()["events"] if e["seq"] > after and e["event"] == "replica_copied"]
        span = max(e["time"] for e in copies) - min(e["time"] - e["seconds"] for e in copies)  # overlapping copies
        replicated = sum(e["bytes"] for e in copies) / max(span, 1e-9) / 1e6
        return served, replicated, plain, socket_copy


def main() -> None:
    root = tempfile.mkdtemp(prefix="rockstate-bench-repl-")
    rows, kinds, base = [], {}, None
    try:
        for bc in (0, 1, 2):
            with cluster(root, bc) as c:
                rate, p50, p99 = write_path(c)
                if bc < 2:
                    kinds.update({(kind, bc): write_path(c, kind) for kind in KINDS})
                if bc == 1:
                    served, replicated, plain, socket_copy = failover(c)
            base = base or (rate, p50)
            rows.append([f"backup_count={bc}", rate, rate / base[0], p50, p50 / base[1], p99])
        print_table(f"batch-1000 put_many and single put, 3 nodes, P={PARTITIONS}, sync replication",
                    ["cluster", "keys/s", "x of 0", "put p50 ms", "x of 0", "put p99 ms"], rows)
        print_table("the same by key kind (each kind's own state; ratios: backup_count=1 against 0, and against ints in random "
                    "order: goal <= 1.2)",
                    ["keys", "bc=0 keys/s", "bc=1 keys/s", "x of 0", "bc=0 p50 ms", "bc=1 p50 ms", "x of 0",
                     "bc=1 cost/key x int_random", "bc=1 p50 x int_random"],
                    [[kind, kinds[kind, 0][0], kinds[kind, 1][0], kinds[kind, 1][0] / kinds[kind, 0][0],
                      kinds[kind, 0][1], kinds[kind, 1][1], kinds[kind, 1][1] / kinds[kind, 0][1],
                      kinds["int_random", 1][0] / kinds[kind, 1][0], kinds[kind, 1][1] / kinds["int_random", 1][1]] for kind in KINDS])
        print_table("kill -9 of a node holding primaries (backup_count=1)",
                    ["measure", "value", "goal"],
                    [["seconds until its keys read again", served, f"<= {HEARTBEAT + 0.5:g} (heartbeat_timeout + 0.5)"],
                     ["re-replication MB/s", replicated, ""],
                     ["plain copy of the same bytes MB/s", plain, ""],
                     ["re-replication / plain copy", replicated / plain, ">= 0.7"],
                     ["the same bytes between two processes over loopback TCP (sendfile) MB/s", socket_copy, ""],
                     ["re-replication / that socket copy", replicated / socket_copy, ">= 0.7 (the same bar)"]])
        direct, relayed = (round_trip_p50_us(hops, PUTS, PUTS // 10) for hops in (1, 2))
        hop_ms, bc0_p50 = (relayed - direct) / 1000, rows[0][3]
        print_table("the floor under the p50 goal: one more hop between uvloop servers that do nothing else",
                    ["measure", "value", "x of backup_count=0"],
                    [["echo server, round trip p50 (µs)", direct, ""],
                     ["through a relay to it, p50 (µs)", relayed, ""],
                     ["backup_count=0 p50 + that hop (ms)", bc0_p50 + hop_ms, (bc0_p50 + hop_ms) / bc0_p50],
                     ["backup_count=1 p50 (ms), above", rows[1][3], rows[1][4]]])
    except RockstateError as e:
        print(f"benchmark failed: {e}")
        raise
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
