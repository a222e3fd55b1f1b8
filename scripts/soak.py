"""Soak: at full write rate, each node's RSS stays within its idle RSS + its memory cap + a margin.

Starts a LocalCluster (coordinator and nodes as separate OS processes), each
node with ``--memory-mib`` as its ``memory_bytes`` (the block cache, with the
memtables charged to it), and runs ``--writers`` writer processes that
``put_many`` random keys of a large keyspace as fast as they can, and after
each batch ``get_many`` a sample of it (checked against what was written) and
as many random older keys (served from SST files, through the block cache).
Every ``--sample`` seconds it reads each node's VmRSS from /proc/<pid>/status.

It proves, and exits 0 only if: every write and checked read succeeded, every
node's largest RSS sample is <= its idle RSS + cap + margin, and each node's
SST files grew past its cap (otherwise the data fit in memory and the soak
proves nothing).

The bound starts from each node's own idle RSS, read before the first write,
because that baseline is the interpreter and the node's imports (numpy,
pyarrow, pydantic, rocksdict, fsspec...) and depends on the machine, not on
the data: 90 MiB on one machine, 122 MiB on another, both before any write.
The margin is what RocksDB uses beyond ``memory_bytes`` (the block cache, with
the memtables, index and bloom filter blocks charged to it). Measured (Python
3.11, rocksdict 0.3.29, 3 nodes, 16 partitions, 2 cores): under load RSS
rises over the first minutes and then stays flat; its largest sample was
idle + cap + 11 to 26 MiB (+14 at a 16 MiB cap for 15 s, +11 on the other
machine; at 64 MiB for 600 s, 700-900 MB per node: median +16, max +26).
That part is flush and compaction buffers, the cache's per-block metadata,
malloc slack and request buffers; it does not grow with the data, since the
index and filter blocks are in the cache (before they were, they added ~3 MiB
per GB of a node's data, and the median was ~10 MiB higher at 500 MB/node).

So the default margin is 48 MiB: the 26 MiB measured plus 22 MiB of headroom.

With backups, the batches each replica keeps in memory (a primary's log, a backup's tail: the newest batches of
every partition, for a promoted backup to resend) are charged to ``memory_bytes`` too: an eighth of it, which
RocksDB's block cache does not get (``replication.partitions.kept_bytes``). Before, they were up to 64 batches a
partition whatever they weighed: at P=1024 with one backup and an 8 MiB cap a node's largest sample was 175 MiB
against a bound of 136; with the budget, 96.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
import traceback

MiB = 1 << 20
MARGIN_DEFAULT = 48  # MiB; see the module docstring


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=600, help="how long to write (default 600)")
    ap.add_argument("--nodes", type=int, default=3, help="state nodes (default 3)")
    ap.add_argument("--partitions", type=int, default=16, help="partitions of the cluster (default 16)")
    ap.add_argument("--memory-mib", type=int, default=64, help="memory_bytes of each node, MiB (default 64)")
    ap.add_argument("--margin-mib", type=int, default=MARGIN_DEFAULT, help=f"allowed RSS above idle + cap, MiB (default {MARGIN_DEFAULT})")
    ap.add_argument("--writers", type=int, default=2, help="writer processes (default 2)")
    ap.add_argument("--value-bytes", type=int, default=200, help="bytes per value (default 200)")
    ap.add_argument("--keys", type=int, default=10_000_000, help="keyspace size (default 10,000,000)")
    ap.add_argument("--batch", type=int, default=1000, help="keys per put_many (default 1000)")
    ap.add_argument("--backup-count", type=int, default=None,
                    help="synchronous backups per partition (default: the coordinator's, 1)")
    ap.add_argument("--sample", type=float, default=1.0, help="seconds between RSS samples (default 1)")
    ap.add_argument("--progress", type=float, default=10.0, help="seconds between progress lines (default 10)")
    return ap.parse_args(argv)


# -- writers (separate processes, so the client's encoding is not one GIL) ----


def writer(address: str, index: int, args: argparse.Namespace, stop, counters) -> None:
    """Random keys k with k % writers == index (so the checked reads see only its own writes)."""
    import numpy as np

    import rockstate

    rng = np.random.default_rng(index)
    pool = rng.bytes(4 * MiB)  # values are slices of it: distinct enough, and incompressible
    step, n = args.writers, args.batch
    span = max(1, (args.keys - index + step - 1) // step)
    try:
        with rockstate.connect(address) as rs:
            state = rs.value_state("soak")
            while not stop.is_set():
                keys = (rng.integers(0, span, n) * step + index).tolist()
                offsets = rng.integers(0, len(pool) - args.value_bytes, n).tolist()
                batch = {k: pool[o:o + args.value_bytes] for k, o in zip(keys, offsets)}
                state.put_many(batch)
                sample = list(batch)[: n // 10]
                older = (rng.integers(0, span, n // 10) * step + index).tolist()
                got = state.get_many(sample + older)
                bad = [k for k, v in zip(sample, got) if v != batch[k]]
                if bad:
                    raise AssertionError(f"writer {index}: {len(bad)} keys read back wrong, e.g. {bad[0]}")
                with counters.get_lock():
                    counters[2 * index] += len(batch)
                    counters[2 * index + 1] += len(sample) + len(older)
    except BaseException:
        traceback.print_exc()
        sys.exit(1)


# -- measuring nodes -----------------------------------------------------------


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise ProcessLookupError(f"pid {pid} has exited (a zombie has no VmRSS)")


def sst_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            if name.endswith(".sst"):
                try:
                    total += os.path.getsize(os.path.join(root, name))
                except FileNotFoundError:  # compacted away meanwhile
                    pass
    return total


def percentile(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def mib(n: float) -> str:
    return f"{n / MiB:.1f}"


# -- the run -------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    from rockstate.local.cluster import LocalCluster

    cap, margin = args.memory_mib * MiB, args.margin_mib * MiB
    ctx = mp.get_context("spawn")
    stop, counters = ctx.Event(), ctx.Array("q", 2 * args.writers)
    print(f"soak: {args.nodes} nodes x {args.memory_mib} MiB cap, margin {args.margin_mib} MiB, "
          f"{args.writers} writers, {args.keys:,} keys x {args.value_bytes} B values, {args.seconds:g} s, "
          f"backup_count {'default' if args.backup_count is None else args.backup_count}", flush=True)
    with LocalCluster(nodes=args.nodes, partitions=args.partitions, node_memory_bytes=cap, processes=True,
                      backup_count=args.backup_count) as cluster:
        nodes = cluster.nodes()
        idle = {n.node_id: rss_bytes(n.pid) for n in nodes}
        print("idle RSS: " + ", ".join(f"{k} {mib(v)} MiB" for k, v in idle.items()), flush=True)
        with cluster.connect() as rs:
            rs.value_state("soak", create=True)  # defined once, before the writers race to
        procs = [ctx.Process(target=writer, args=(cluster.address, i, args, stop, counters), daemon=True)
                 for i in range(args.writers)]
        for proc in procs:
            proc.start()
        samples: dict[str, list[int]] = {n.node_id: [] for n in nodes}
        start = time.monotonic()
        next_sample = next_progress = start
        died = []
        while time.monotonic() - start < args.seconds and not died:
            for n in nodes:
                try:
                    samples[n.node_id].append(rss_bytes(n.pid))
                except (FileNotFoundError, ProcessLookupError):
                    died.append(f"node {n.node_id} (pid {n.pid})")
            died += [f"writer {i} (exit code {p.exitcode})" for i, p in enumerate(procs) if not p.is_alive()]
            now = time.monotonic()
            if now >= next_progress:
                written = sum(counters[0::2])
                disk = sum(sst_bytes(n.data_dir) for n in nodes)
                rss = " ".join(mib(s[-1]) for s in samples.values() if s)
                print(f"[{now - start:6.0f}s] keys {written:>11,}  {written / max(now - start, 1e-9):>8,.0f} keys/s  "
                      f"sst {mib(disk):>8} MiB  rss MiB: {rss}", flush=True)
                next_progress += args.progress
            next_sample += args.sample
            stop.wait(max(0.0, next_sample - time.monotonic()))  # the sampling period, not a condition
        elapsed = time.monotonic() - start
        stop.set()
        for i, proc in enumerate(procs):
            proc.join(60)
            if proc.exitcode != 0 and not any(d.startswith(f"writer {i} ") for d in died):
                died.append(f"writer {i} (exit code {proc.exitcode}; None: still running after 60 s)")
        disk = {n.node_id: sst_bytes(n.data_dir) for n in nodes}
    return report(args, samples, disk, idle, cap, margin, elapsed, counters, died)


def report(args, samples, disk, idle, cap, margin, elapsed, counters, died) -> int:
    ok = not died
    head = f"{'node':<10}{'idle':>8}{'median':>8}{'p99':>8}{'max':>8}{'cap':>8}{'margin':>8}{'bound':>8}{'sst':>9}  verdict"
    print(f"\nRSS per node, MiB ({len(next(iter(samples.values())))} samples each):\n{head}\n{'-' * len(head)}")
    for node, values in samples.items():
        top = max(values) if values else 0
        bound = idle[node] + cap + margin
        fits, grew = bool(values) and top <= bound, disk[node] > cap
        verdict = ("ok" if fits else "OVER BOUND") + ("" if grew else ", data fits in cap")
        ok = ok and fits and grew
        print(f"{node:<10}{mib(idle[node]):>8}{mib(statistics.median(values) if values else 0):>8}"
              f"{mib(percentile(values, 0.99) if values else 0):>8}{mib(top):>8}{mib(cap):>8}{mib(margin):>8}"
              f"{mib(bound):>8}{mib(disk[node]):>9}  {verdict}")
    written, read = sum(counters[0::2]), sum(counters[1::2])
    print(f"\nkeys written {written:,} in {elapsed:.0f} s: {written / elapsed:,.0f} keys/s, "
          f"{written * args.value_bytes / elapsed / 1e6:.2f} MB/s of values; keys read {read:,}")
    print(f"data on disk (SST) {mib(sum(disk.values()))} MiB in total vs {mib(cap)} MiB cap per node")
    for what in died:
        print(f"FAILED: {what} stopped during the soak")
    print("OK" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(run(parse_args()))
