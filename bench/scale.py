"""Scale: what the same work costs as the partition count P (and the node count) grows (issue 33).

One run, side by side: for each P in BENCH_SCALE_P (16, 128, 271, 1024) a multi-process
``LocalCluster`` of 3 nodes with the default backup (``backup_count=1``, sync) and file
checkpoints, heartbeat_timeout 3 s; KEYS (``--keys``, default 50,000) 36-character UUID
string keys with 100-byte values, written and read in batches of 5,000:

- start-up: from ``LocalCluster.start()`` until every partition is owned and its backup in sync;
- batch put and batch get, keys/s (the median batch of each; the puts twice over the same batches);
- checkpoint: one full ``rs.checkpoint()``, seconds;
- kill -> served: kill -9 of a node, seconds until one key of every partition it was primary of
  reads its value again (a client retrying as users' do);
- join -> balanced: a fourth node started, seconds until the table is balanced and every backup in sync;
- at rest, after the start-up: the coordinator's CPU seconds per second over ``REST`` seconds, and the table it
  publishes, bytes as sent (msgpack);
- loop lag: the worst event-loop lag (``rockstate_*_loop_lag_max_seconds``) of the coordinator and of any node
  still alive at the end, seconds (a node stops serving when its loop stalls for half its lease); beside it the
  longest garbage-collector pause of those processes (``*_gc_pause_max_seconds``), and the worst lag of an idle
  loop in a process of its own meanwhile (``testing.idle_loop``): what the machine alone cost a loop, which on
  this shared machine stalls every process at once now and then.

Each with its ratio to the smallest configuration (goal, issue 33: throughput >= 0.8x, times <= 2x). Beside the P
curve, the same puts with ``backup_count=0`` (what replication's per-partition work adds as P grows); beside the
node curve, the same node processes started at P=16 (their own start, which on 2 cores grows with their number
whatever the partitions do) and P=1024's start-up above it.
The floor: embedded (``rockstate.open``, one process, no network, no backups) put/get of the same
keys at the same P. ``--nodes 3,8,16`` adds the node-count curve at P=1024 (start-up, put, get,
checkpoint, kill, join, leave, at rest, loop lag); ``make scale`` runs it at 3, 8 and 16 nodes. Medians of one run on a shared 2-core machine: compare ratios
within a run, not across runs.

    .venv/bin/python bench/scale.py [--keys 50000] [--partitions 16,128,271,1024] [--nodes 3,8,16]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
import urllib.request

import msgpack

sys.path.insert(0, os.path.dirname(__file__))

from common import key_of, print_table  # noqa: E402

import rockstate  # noqa: E402
from rockstate.errors import RockstateError  # noqa: E402
from rockstate.files import read_json  # noqa: E402
from rockstate.local.cluster import LocalCluster  # noqa: E402
from rockstate.testing.idle_loop import IdleLoop  # noqa: E402

BATCH = 5000
VALUE = os.urandom(100)
HEARTBEAT = 3.0
REST = 5.0  # seconds the coordinator's CPU is measured at rest
PUT_PASSES = 2  # the puts' passes over the same batches: their median over twice the batches


def _batches(keys: list) -> list[list]:
    return [keys[s:s + BATCH] for s in range(0, len(keys), BATCH)]


def _rates(fn, batches: list[list], passes: int = 1) -> float:
    """The median batch's keys/s of ``fn(batch)`` over every batch, ``passes`` times over them (puts: twice, the
    second overwriting the first's keys: four batches of a 20,000-key run gave 0.67-0.95x for the same code)."""
    rates = []
    for _ in range(passes):
        for batch in batches:
            start = time.perf_counter()
            fn(batch)
            rates.append(len(batch) / (time.perf_counter() - start))
    return statistics.median(rates)


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU seconds so far (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def worst_loop_lag(c: LocalCluster) -> tuple[float, float]:
    """The worst event-loop lag and the longest garbage-collector pause of the coordinator (its /metrics) and of the
    live nodes (their figures in the status)."""
    text = urllib.request.urlopen(c.status_url + "metrics", timeout=30).read().decode()
    worst = {name: [float(line.split()[-1]) for line in text.splitlines() if line.startswith(f"rockstate_coordinator_{name} ")]
             for name in ("loop_lag_max_seconds", "gc_pause_max_seconds")}
    doc = json.loads(urllib.request.urlopen(c.status_url + "api/status", timeout=60).read())
    for name, values in worst.items():
        values += [(n.get("figures") or {}).get(name) or 0.0 for n in doc["nodes"] if n["status"] == "alive"]
    return max(worst["loop_lag_max_seconds"]), max(worst["gc_pause_max_seconds"])


def started(root: str, partitions: int, nodes: int, keys: list | None = None, backup_count: int | None = None) -> dict:
    """A cluster's start-up alone, seconds, and with ``keys`` its batch put keys/s: the references beside each row
    (the same processes at P=16, where their own start is most of it; the same puts without backups)."""
    path = os.path.join(root, f"ref-p{partitions}-n{nodes}-b{backup_count}")
    c = PatientCluster(nodes=nodes, partitions=partitions, root=path, heartbeat_timeout=HEARTBEAT,
                       backup_count=backup_count, node_memory_bytes=64 << 20)
    row: dict = {}
    try:
        start = time.perf_counter()
        c.start()
        row["start-up s"] = time.perf_counter() - start
        if keys:
            with c.connect(retry_timeout=120.0) as rs:
                state = rs.value_state("scale")
                row["put keys/s"] = _rates(lambda b: state.put_many(dict.fromkeys(b, VALUE)), _batches(keys), PUT_PASSES)
    finally:
        c.close()
        shutil.rmtree(path, ignore_errors=True)
    return row


def embedded(root: str, partitions: int, keys: list) -> tuple[float, float]:
    path = os.path.join(root, f"embedded-{partitions}")
    try:
        with rockstate.open(path, partitions=partitions) as rs:
            state = rs.value_state("scale")
            batches = _batches(keys)
            put = _rates(lambda b: state.put_many(dict.fromkeys(b, VALUE)), batches, PUT_PASSES)
            get = _rates(lambda b: state.get_many(b), batches)
            return put, get
    finally:
        shutil.rmtree(path, ignore_errors=True)


class PatientCluster(LocalCluster):
    """LocalCluster whose start waits up to 600 s for every backup in sync (its own default is 60 s: P=1024 takes more)."""

    def wait_replicated(self, timeout: float = 600.0) -> dict:
        return super().wait_replicated(timeout)

    def wait_balanced(self, timeout: float = 600.0) -> dict:
        return super().wait_balanced(timeout)


def cluster_run(root: str, partitions: int, nodes: int, keys: list, leave: bool = False) -> dict:
    """One configuration's row: every measure, seconds or keys/s, and the worst lag of an idle loop meanwhile."""
    with IdleLoop() as idle:
        row = _cluster_row(root, partitions, nodes, keys, leave)
    row["idle loop lag s"] = idle.worst
    return row


def _cluster_row(root: str, partitions: int, nodes: int, keys: list, leave: bool) -> dict:
    row: dict = {}
    path = os.path.join(root, f"p{partitions}-n{nodes}")
    c = PatientCluster(nodes=nodes, partitions=partitions, root=path, heartbeat_timeout=HEARTBEAT,
                     checkpoints=f"file://{path}/checkpoints", node_memory_bytes=64 << 20)
    try:
        start = time.perf_counter()
        c.start()  # waits until balanced and every backup in sync
        row["start-up s"] = time.perf_counter() - start
        coordinator = read_json(os.path.join(path, "coordinator", "address.json"))["pid"]
        before = cpu_seconds(coordinator)
        time.sleep(REST)
        row["coord CPU s/s"] = (cpu_seconds(coordinator) - before) / REST
        with c.connect(retry_timeout=120.0) as rs:
            row["table bytes"] = len(msgpack.packb(rs.backend.refresh().to_wire()))
            state = rs.value_state("scale")
            batches = _batches(keys)
            row["put keys/s"] = _rates(lambda b: state.put_many(dict.fromkeys(b, VALUE)), batches, PUT_PASSES)
            row["get keys/s"] = _rates(lambda b: state.get_many(b), batches)
            got = state.get_many(keys[:100])
            assert all(v == VALUE for v in got)
            start = time.perf_counter()
            rs.checkpoint()
            row["checkpoint s"] = time.perf_counter() - start
            # kill -9 of a node holding primaries: until a key of each of its partitions reads again
            table = rs.backend.refresh()
            victim = c.nodes()[0]
            lost = set(table.owned_by(victim.node_id))
            probes: dict[int, str] = {}
            for k in keys:
                pid = rs.partition_of(k)
                if pid in lost and pid not in probes:
                    probes[pid] = k
            killed = time.perf_counter()
            c.kill_node(victim.node_id)
            for k in probes.values():
                assert state.get(k) == VALUE
            row["kill->served s"] = time.perf_counter() - killed
            c.wait_replicated(600)
            start = time.perf_counter()
            c.add_node(wait=False)
            c.wait_replicated(600)
            row["join->balanced s"] = time.perf_counter() - start
            if leave:
                start = time.perf_counter()
                c.stop_node(c.nodes()[0].node_id, timeout=600)
                c.wait_replicated(600)
                row["leave->balanced s"] = time.perf_counter() - start
            assert all(v == VALUE for v in state.get_many(keys[:BATCH]))
            row["loop lag s"], row["GC pause s"] = worst_loop_lag(c)
    except (RockstateError, AssertionError) as e:
        traceback.print_exc()
        row["failed"] = f"{type(e).__name__}: {str(e)[:200]}"
    finally:
        c.close()
        shutil.rmtree(path, ignore_errors=True)
    return row


COLUMNS = ["start-up s", "put keys/s", "get keys/s", "checkpoint s", "kill->served s", "join->balanced s"]
AT_REST = ["coord CPU s/s", "table bytes", "loop lag s", "GC pause s", "idle loop lag s"]


def _table(title: str, label: str, rows: list[tuple[object, dict]], columns: list[str]) -> None:
    base = rows[0][1]
    out = []
    for name, row in rows:
        cells: list[object] = [name]
        for col in columns:
            v = row.get(col)
            cells += ["-", "-"] if v is None else [v, v / base[col] if base.get(col) else "-"]
        out.append(cells)
    header = [label] + [h for col in columns for h in (col, "x")]
    print_table(title, header, out)
    for name, row in rows:
        if "failed" in row:
            print(f"  {label}={name} failed: {row['failed']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=int(os.environ.get("BENCH_SCALE_KEYS", 50_000)))
    parser.add_argument("--partitions", default=os.environ.get("BENCH_SCALE_P", "16,128,271,1024"))
    parser.add_argument("--nodes", default="", help="node counts at P=1024 (e.g. 3,8,16); empty: skip")
    parser.add_argument("--no-embedded", action="store_true")
    args = parser.parse_args()
    keys = [key_of("uuid", i) for i in range(args.keys)]
    ps = [int(x) for x in args.partitions.split(",") if x]
    root = tempfile.mkdtemp(prefix="rockstate-bench-scale-")
    print(f"{args.keys:,} UUID keys, 100-byte values, batches of {BATCH:,}; 3 nodes, backup_count=1 (sync), "
          f"file checkpoints, heartbeat_timeout {HEARTBEAT:g} s", flush=True)
    try:
        rows, floor, unreplicated = [], [], []
        for P in ps:
            row = cluster_run(root, P, 3, keys)
            print(f"P={P}: {row}", flush=True)
            rows.append((P, row))
            unreplicated.append((P, {"put keys/s": started(root, P, 3, keys, backup_count=0)["put keys/s"]}))
            if not args.no_embedded:
                put, get = embedded(root, P, keys)
                floor.append((P, {"put keys/s": put, "get keys/s": get}))
        if rows:
            _table(f"3 nodes, backup_count=1: each measure and its ratio to P={ps[0]} (goal: keys/s >= 0.8x, seconds <= 2x)",
                   "P", rows, COLUMNS)
            _table(f"3 nodes: the coordinator at rest, the worst event-loop lag and GC pause, an idle loop's lag meanwhile (ratio to P={ps[0]})", "P", rows, AT_REST)
        if rows:
            base = unreplicated[0][1]["put keys/s"]
            print_table(f"what replication costs a put as P grows: the same batches on 3 nodes with backup_count=0 and =1, "
                        f"keys/s, each against P={ps[0]} and against each other", ["P", "put b0", "x", "put b1", "x", "b1 x b0"],
                        [[P, u["put keys/s"], u["put keys/s"] / base, r.get("put keys/s", 0),
                          r.get("put keys/s", 0) / rows[0][1].get("put keys/s", 1), r.get("put keys/s", 0) / u["put keys/s"]]
                         for (P, r), (_, u) in zip(rows, unreplicated)])
        if floor:
            _table(f"the floor: embedded rockstate.open, one process, same keys and batches (ratio to P={ps[0]})",
                   "P", floor, ["put keys/s", "get keys/s"])
            print_table("cluster against embedded at the same P", ["P", "put x embedded", "get x embedded"],
                        [[P, r.get("put keys/s", 0) / f["put keys/s"], r.get("get keys/s", 0) / f["get keys/s"]]
                         for (P, r), (_, f) in zip(rows, floor)])
        if args.nodes:
            node_rows, processes = [], []
            for n in [int(x) for x in args.nodes.split(",")]:
                row = cluster_run(root, 1024, n, keys, leave=True)
                print(f"nodes={n}: {row}", flush=True)
                node_rows.append((n, row))
                alone = started(root, 16, n)["start-up s"]
                processes.append((n, {"processes s": alone, "above them s": row.get("start-up s", alone) - alone}))
            _table("P=1024, backup_count=1: by node count (ratio to the fewest)", "nodes", node_rows,
                   COLUMNS + ["leave->balanced s"])
            _table("start-up by node count: the same processes at P=16 (their own start on these cores, what grows with "
                   "them here), and P=1024's start-up above it (ratio to the fewest)", "nodes", processes,
                   ["processes s", "above them s"])
            _table("P=1024: the coordinator at rest, the worst event-loop lag and GC pause, an idle loop's lag meanwhile, by node count", "nodes", node_rows, AT_REST)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
