"""What a batch put costs the nodes: their CPU per key and per batch, and their wake-ups per batch.

The steadiest measure of a change to the write path on a shared machine: keys/s swing with whatever else runs,
the nodes' own CPU seconds (from /proc) much less. Starts a LocalCluster (coordinator and nodes as processes),
writes UUID keys with 100-byte values in batches of ``--batch`` for ``--seconds`` after a warm-up, and prints the
median batch's keys/s, the nodes' CPU per key and per batch, their context switches per batch (voluntary: a
process woken by a message; involuntary: preempted), and the client's CPU per key. ``--py-spy DIR`` also records
the first three nodes with py-spy (raw stacks, ``--gil``: Python's own time; ``.venv/bin/pip install py-spy``)
for as long.

To compare two trees, run it from outside the checkout with ``PYTHONPATH`` set to a copy of the other
(``git archive <commit> rockstate | tar -x -C /tmp/base``): a process started in the checkout imports the
checkout's ``rockstate`` first. Interleave the runs (A, B, A, B): the machine drifts.

    .venv/bin/python scripts/node_cpu.py --nodes 3 --partitions 1024 --seconds 15
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

from rockstate import LocalCluster

VALUE = os.urandom(100)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def switches(pids: list[int]) -> tuple[int, int]:
    """The processes' voluntary and involuntary context switches so far."""
    voluntary = involuntary = 0
    for pid in pids:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches"):
                    voluntary += int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches"):
                    involuntary += int(line.split()[1])
    return voluntary, involuntary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=1024)
    ap.add_argument("--backup-count", type=int, default=1)
    ap.add_argument("--batch", type=int, default=5000, help="keys per put_many (default 5,000)")
    ap.add_argument("--keys", type=int, default=50_000, help="distinct keys, written over and over (default 50,000)")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--py-spy", metavar="DIR", help="record the first three nodes into DIR/node-<i>.txt")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="rockstate-node-cpu-")
    cluster = LocalCluster(nodes=args.nodes, partitions=args.partitions, backup_count=args.backup_count, root=root,
                           heartbeat_timeout=3.0, node_memory_bytes=64 << 20)
    cluster.start()
    spies: list[subprocess.Popen] = []
    try:
        pids = [n.pid for n in cluster.nodes()]
        keys = [str(uuid.uuid4()) for _ in range(args.keys)]
        batches = [keys[s:s + args.batch] for s in range(0, len(keys), args.batch)]
        with cluster.connect(retry_timeout=120.0) as rs:
            state = rs.value_state("node-cpu")
            for batch in batches:  # warm-up: every partition written once
                state.put_many(dict.fromkeys(batch, VALUE))
            if args.py_spy:
                os.makedirs(args.py_spy, exist_ok=True)
                spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")  # the venv's
                spies = [subprocess.Popen([spy, "record", "-r", "200", "-d", str(int(args.seconds)), "-f", "raw", "--gil",
                                           "--nonblocking", "-o", os.path.join(args.py_spy, f"node-{i}.txt"), "-p", str(pid)],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i, pid in enumerate(pids[:3])]
            cpu, woken, client, rates, written = sum(map(cpu_seconds, pids)), switches(pids), time.process_time(), [], 0
            started = time.perf_counter()
            while time.perf_counter() - started < args.seconds:
                for batch in batches:
                    t = time.perf_counter()
                    state.put_many(dict.fromkeys(batch, VALUE))
                    rates.append(len(batch) / (time.perf_counter() - t))
                    written += len(batch)
            cpu, client = sum(map(cpu_seconds, pids)) - cpu, time.process_time() - client
            voluntary, involuntary = (after - before for after, before in zip(switches(pids), woken))
        n = written / args.batch
        print(f"{args.nodes} nodes, P={args.partitions}, backup_count={args.backup_count}, {args.batch:,}-key batches: "
              f"median {statistics.median(rates):,.0f} keys/s; nodes' CPU {1e6 * cpu / written:.2f} µs a key, "
              f"{1e3 * cpu / n:.1f} ms a batch; wake-ups a batch {voluntary / n:.0f} (preempted {involuntary / n:.0f}); "
              f"client's CPU {1e6 * client / written:.2f} µs a key")
    finally:
        for spy in spies:
            spy.wait()
        cluster.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
