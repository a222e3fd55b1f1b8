"""Partition moves and failover on multi-process LocalClusters: how long writes wait, how long a dead node's partitions are away.

1. Write-blocked window per moved partition. For each partition size S in
   BENCH_MIGRATION_MB (default "10,100"; "500" for big partitions) and each
   key kind (ints, 36-character UUID strings, (tenant id, int) tuples), two clusters of one node and
   P=4 partitions, each partition filled to ~S MB with 1 KB values of random
   bytes (incompressible): one moves partitions live (the default: copy while
   the source serves, freeze only to hand over the writes made since), the
   other is the baseline that freezes a partition for its whole copy
   (coordinator setting ``live_migration=False``). Both are loaded first, then
   they take turns, BENCH_MIGRATION_ROUNDS (default 3) rounds each: a node
   joins (2 of the 4 partitions move to it), then it leaves gracefully (they
   move back), so a round gives 4 moved partitions. During every move a
   writer thread keeps writing small batches to random keys in all partitions
   (BENCH_MIGRATION_WRITE_RATE keys/s, default 4000, ~4 MB/s), so each live
   move has a real delta to hand over. Before each join or leave, dirty pages
   are written back (os.sync) and the nodes left to go idle, so every move
   starts from data on disk and no compaction from the load runs alongside. The window of each move is the
   coordinator's ``write_blocked_seconds`` (``migration_finished`` events):
   live, from the freeze to the new table being applied by every node;
   baseline, from the start of the move to the same point. The writer's own
   worst ``put_many`` latency is reported as a client-side cross-check. At the
   end every acknowledged write of the writer is read back (its value names
   its key and version) and the key count is checked: a run that loses
   anything fails instead of reporting numbers.
   Goal: live window p99 <= 100 ms, and flat as the partition size grows.

2. Failover. A 3-node cluster, P=12, heartbeat_timeout=1.0 s, checkpoints to
   file://, BENCH_FAILOVER_MB (default 120) of data, a checkpoint, one run per key kind; then one
   node is killed with SIGKILL and a client (retry_timeout=120 s) reads one
   key of each of the dead node's partitions. Reported: detection (kill ->
   the coordinator's ``member_dead`` event), restored (kill -> the last
   ``partition_restored`` event: the new owners have restored the checkpoint
   and the table is out) and served (kill -> the client's read returned, with
   the right values). BENCH_FAILOVER_RUNS (default 1) runs per key kind,
   each on a fresh cluster.

Event times are the coordinator's wall clock (time.time()); the benchmark
runs on the same machine and compares them with its own.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from contextlib import ExitStack

sys.path.insert(0, os.path.dirname(__file__))

from common import KEY_KINDS, key_of, print_table  # noqa: E402

from rockstate.local.cluster import LocalCluster  # noqa: E402
from rockstate.errors import RockstateError  # noqa: E402

MB = 1 << 20
SIZES_MB = [int(s) for s in os.environ.get("BENCH_MIGRATION_MB", "10,100").split(",") if s.strip()]
ROUNDS = int(os.environ.get("BENCH_MIGRATION_ROUNDS", 3))
WRITE_RATE = int(os.environ.get("BENCH_MIGRATION_WRITE_RATE", 4000))  # keys/s written during every move
FAILOVER_MB = int(os.environ.get("BENCH_FAILOVER_MB", 120))
FAILOVER_RUNS = int(os.environ.get("BENCH_FAILOVER_RUNS", 1))

PARTITIONS = 4
MOVES_PER_STEP = PARTITIONS // 2  # 1 node -> 2 nodes (or back): half the partitions move
FAILOVER_PARTITIONS = 12
HEARTBEAT_TIMEOUT = 1.0
VALUE_BYTES = 1000  # 16 bytes of (key, version) + random bytes
LOAD_BATCH = 2000
WRITE_BATCH = 40
EVENT_TIMEOUT = 900.0
SETTLE_TIMEOUT = 120.0

GOAL_WINDOW_P99_MS = 100.0


# -- values that name their key (by its index: the kind's key_of(i)) and version -------


def make_values(keys: list[int], version: int) -> list[bytes]:
    filler = VALUE_BYTES - 16
    blob = os.urandom(len(keys) * filler)
    tag = version.to_bytes(8, "big")
    return [k.to_bytes(8, "big") + tag + blob[i * filler : (i + 1) * filler] for i, k in enumerate(keys)]


def version_of(key: int, value: bytes | None) -> int | None:
    if value is None or len(value) != VALUE_BYTES or int.from_bytes(value[:8], "big") != key:
        return None
    return int.from_bytes(value[8:16], "big")


def load(state, keys: int, kind: str) -> float:
    t = time.perf_counter()
    for start in range(0, keys, LOAD_BATCH):
        batch = list(range(start, min(start + LOAD_BATCH, keys)))
        state.put_many([key_of(kind, i) for i in batch], make_values(batch, 0))
    return time.perf_counter() - t


def percentile(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


# -- cluster helpers -------------------------------------------------------------------


def last_seq(rs) -> int:
    events = rs.backend.events()
    return events[-1]["seq"] if events else 0


def wait_events(rs, after: int, kind: str, count: int, timeout: float = EVENT_TIMEOUT) -> list[dict]:
    """The events after ``after`` until ``count`` of ``kind`` have come; fails on a failed move."""
    deadline = time.monotonic() + timeout
    seen: list[dict] = []
    while sum(e["event"] == kind for e in seen) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {count} {kind} events; saw {[e['event'] for e in seen]}")
        new = rs.backend.events(after, wait=1.0)
        if new:
            after = new[-1]["seq"]
            seen += new
        failed = [e for e in seen if e["event"] == "migration_failed"]
        if failed:
            raise RuntimeError(f"a move failed: {failed[0]}")
    return seen


def cpu_ticks(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime + stime
        except (OSError, IndexError, ValueError):
            pass
    return total


def settle(cluster: LocalCluster, timeout: float = SETTLE_TIMEOUT) -> None:
    """Write every dirty page back, then wait until the nodes are idle (flushes and compactions done).

    The sync matters: a partition that has lived a while is on disk, and on
    ext4 freeing blocks that are on disk costs far more than dropping data
    still waiting in the page cache (delayed allocation). Without it the moves
    back (whose data the join has just written) would look cheaper than a
    move of an old partition.
    """
    os.sync()
    hz = os.sysconf("SC_CLK_TCK")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = [n.pid for n in cluster.nodes()]
        before = cpu_ticks(pids)
        time.sleep(0.5)
        if (cpu_ticks(pids) - before) / hz < 0.025:  # under 5% of a core
            return


class Writer:
    """Writes batches of random keys at a steady rate while started; remembers the last acknowledged version of each key."""

    def __init__(self, rs, keys: int, rate: int, kind: str) -> None:
        self.state, self.kind = rs.value_state("bench"), kind
        self.keys, self.interval = keys, WRITE_BATCH / rate
        self.version = 0
        self.acked: dict[int, int] = {}
        self.latencies: list[float] = []
        self.errors: list[Exception] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        nxt = time.perf_counter()
        while not self._stop.is_set():
            self.version += 1
            keys = random.sample(range(self.keys), WRITE_BATCH)
            values = make_values(keys, self.version)
            t = time.perf_counter()
            try:
                self.state.put_many([key_of(self.kind, i) for i in keys], values)
            except RockstateError as e:  # not acknowledged: not counted, and the run fails at the end
                self.errors.append(e)
                continue
            now = time.perf_counter()
            self.latencies.append(now - t)
            self.acked.update(dict.fromkeys(keys, self.version))
            nxt = max(nxt + self.interval, now)  # a write that waited does not make the next ones burst
            self._stop.wait(max(0.0, nxt - time.perf_counter()))

    def start(self) -> None:
        self._stop.clear()
        self.latencies = []
        self._thread = threading.Thread(target=self._run, name="bench-writer", daemon=True)
        self._thread.start()

    def stop(self) -> list[float]:
        """Stop; the put_many latencies since start()."""
        self._stop.set()
        self._thread.join(EVENT_TIMEOUT)
        if self._thread.is_alive():
            raise RuntimeError("the writer did not stop")
        return self.latencies

    def check(self) -> int:
        """Every acknowledged write is readable (at its version or a later one); returns how many keys were checked."""
        if self.errors:
            raise RuntimeError(f"the writer saw {len(self.errors)} failed writes: {self.errors[:3]}")
        items = sorted(self.acked.items())
        for start in range(0, len(items), 10_000):
            chunk = items[start : start + 10_000]
            stored = self.state.get_many([key_of(self.kind, k) for k, _ in chunk])
            for (key, version), value in zip(chunk, stored):
                got = version_of(key, value)
                if got is None or got < version:
                    raise RuntimeError(f"acknowledged write lost: key {key} version {version}, stored {got}")
        return len(items)


# -- 1. moves ----------------------------------------------------------------------------


class Side:
    """One cluster (live or baseline) with its clients and writer, loaded with 4 x S MB."""

    def __init__(self, stack: ExitStack, root: str, live: bool, keys: int, kind: str) -> None:
        self.name = "live" if live else "freeze-copy-all"
        self.keys = keys
        self.cluster = stack.enter_context(LocalCluster(
            nodes=1, partitions=PARTITIONS, root=os.path.join(root, self.name),
            coordinator_settings={"live_migration": live}))
        self.rs = stack.enter_context(self.cluster.connect(retry_timeout=EVENT_TIMEOUT))
        self.writer = Writer(stack.enter_context(self.cluster.connect(retry_timeout=EVENT_TIMEOUT)), keys, WRITE_RATE, kind)
        self.load_seconds = load(self.rs.value_state("bench"), keys, kind)
        self.moves: list[dict] = []
        self.worst_put = 0.0

    def step(self, action):
        """Run ``action`` (a join or a leave) under the writer; collect its moves; returns what ``action`` returned."""
        settle(self.cluster)
        after = last_seq(self.rs)
        self.writer.start()
        time.sleep(0.3)  # writes are flowing before the move starts
        try:
            result = action()
            events = wait_events(self.rs, after, "migration_finished", MOVES_PER_STEP)
            time.sleep(0.3)
        finally:
            latencies = self.writer.stop()
        moves = [e for e in events if e["event"] == "migration_finished"]
        if any(e["bytes"] <= 0 for e in moves):
            raise RuntimeError(f"a move copied nothing: {moves}")
        self.moves += moves
        self.worst_put = max([self.worst_put, *latencies])
        return result

    def round(self) -> None:
        """A node joins (half the partitions move to it), then leaves gracefully (they move back)."""
        joined = self.step(self.cluster.add_node)
        self.step(lambda: self.cluster.stop_node(joined.node_id))
        self.cluster.wait_balanced()

    def check(self) -> None:
        self.writer.check()
        n = self.rs.value_state("bench").count()
        if n != self.keys:
            raise RuntimeError(f"{self.name}: {n} keys after the moves, {self.keys} loaded")


def moves(root: str) -> None:
    rows, copied_mb, live_p99 = [], [], {}
    for size, kind in [(size, kind) for size in SIZES_MB for kind in KEY_KINDS]:
        keys = PARTITIONS * size * MB // VALUE_BYTES
        started = time.perf_counter()
        with ExitStack() as stack:
            sides = [Side(stack, os.path.join(root, f"m{size}-{kind}"), live, keys, kind) for live in (True, False)]
            for _ in range(ROUNDS):
                for side in sides:  # the two clusters take turns, so drift on the machine hits both alike
                    side.round()
            for side in sides:
                side.check()
        log(f"{size} MB partitions, {kind} keys: loaded in {sum(s.load_seconds for s in sides):.0f} s, all in {time.perf_counter() - started:.0f} s")
        live, base = (sorted(e["write_blocked_seconds"] * 1000 for e in side.moves) for side in sides)
        mb = statistics.median(e["bytes"] for s in sides for e in s.moves) / MB
        copied_mb.append(mb)
        live_p99[size] = max(live_p99.get(size, 0.0), percentile(live, 99))
        for side, windows in zip(sides, (live, base)):
            is_base = side is sides[1]
            rows.append([
                f"{kind}: ~{size} MB ({mb:.0f} MB copied)", side.name, len(windows),
                statistics.median(e["seconds"] for e in side.moves),
                statistics.median(e["delta_ops"] for e in side.moves),
                percentile(windows, 50), percentile(windows, 99), max(windows), side.worst_put * 1000,
                percentile(base, 50) / max(percentile(live, 50), 1e-3) if is_base else "-",
                percentile(base, 99) / max(percentile(live, 99), 1e-3) if is_base else "-",
            ])
    sizes = ", ".join(f"{mb:.0f}" for mb in copied_mb)
    print_table(
        f"migration: write-blocked window per moved partition; P={PARTITIONS}, partitions of {sizes} MB as copied, "
        f"1 KB values, writer {WRITE_RATE:,} keys/s in batches of {WRITE_BATCH} during every move, "
        f"{ROUNDS} rounds x (join + leave) = {ROUNDS * 2 * MOVES_PER_STEP} moves per row "
        f"(goal: live p99 <= {GOAL_WINDOW_P99_MS:.0f} ms and flat as size grows)",
        ["partition size", "mode", "moves", "move s p50", "delta ops p50", "blocked ms p50", "p99", "max",
         "writer worst put ms", "base/live p50", "base/live p99"],
        rows,
    )
    if live_p99:
        small, big = min(live_p99), max(live_p99)
        worst = max(live_p99.values())
        print(f"live p99 worst {worst:.1f} ms: goal <= {GOAL_WINDOW_P99_MS:.0f} ms {'met' if worst <= GOAL_WINDOW_P99_MS else 'NOT met'}; "
              f"flatness: live p99 at ~{big} MB / at ~{small} MB = {live_p99[big] / max(live_p99[small], 1e-3):.2f}")


# -- 2. failover ---------------------------------------------------------------------------


def failover_run(root: str, run: int, kind: str) -> list[float]:
    keys = FAILOVER_MB * MB // VALUE_BYTES
    with LocalCluster(nodes=3, partitions=FAILOVER_PARTITIONS, root=os.path.join(root, f"f{run}"),
                      heartbeat_timeout=HEARTBEAT_TIMEOUT, checkpoints=f"file://{root}/f{run}-checkpoints") as cluster:
        with cluster.connect(retry_timeout=120.0) as rs:
            state = rs.value_state("bench")
            load(state, keys, kind)
            chk = rs.checkpoint().checkpoint_id
            table = rs.backend.refresh()
            victim = random.choice(cluster.nodes()).node_id
            lost = table.owned_by(victim)
            probes: dict[int, int] = {}
            for key in map(lambda i: key_of(kind, i), range(keys)):
                if rs.partition_of(key) in lost:
                    probes.setdefault(rs.partition_of(key), key)
                if len(probes) == len(lost):
                    break
            probe_keys = list(probes.values())
            expected = state.get_many(probe_keys)
            after = last_seq(rs)
            wall, start = time.time(), time.perf_counter()
            cluster.kill_node(victim)
            got = state.get_many(probe_keys)  # retries until every partition is served again
            served = time.perf_counter() - start
            if got != expected:
                raise RuntimeError(f"partitions {sorted(probes)} came back with other values than checkpoint {chk} holds")
            events = wait_events(rs, after, "partition_restored", len(lost), timeout=120.0)
            dead = [e["time"] - wall for e in events if e["event"] == "member_dead" and e["node"] == victim]
            restored = [e for e in events if e["event"] == "partition_restored"]
            if not dead or sorted(e["partition"] for e in restored) != sorted(lost) or any(e["checkpoint"] != chk for e in restored):
                raise RuntimeError(f"unexpected failover events: {events}")
            if state.count() != keys:
                raise RuntimeError("keys lost in the failover")
            last_restored = max(e["time"] for e in restored) - wall
            return [len(lost), dead[0], last_restored - dead[0], last_restored, served]


def failover(root: str) -> None:
    runs, names = [], []
    for run, kind in enumerate(kind for kind in KEY_KINDS for _ in range(FAILOVER_RUNS)):
        runs.append(failover_run(root, run, kind))
        names.append(f"{kind} keys, run {run % FAILOVER_RUNS + 1}")
        log(f"failover {names[-1]}: served again after {runs[-1][-1]:.2f} s")
    per_partition = FAILOVER_MB / FAILOVER_PARTITIONS
    rows = [[name, *r] for name, r in zip(names, runs)]
    rows.append(["median", statistics.median_low(r[0] for r in runs), *(statistics.median(r[i] for r in runs) for i in range(1, 5))])
    print_table(
        f"failover: kill -9 of 1 of 3 nodes, P={FAILOVER_PARTITIONS} (~{per_partition:.0f} MB each, {FAILOVER_MB} MB in all), "
        f"heartbeat_timeout {HEARTBEAT_TIMEOUT:g} s, restore from a file:// checkpoint, client retry_timeout 120 s "
        f"(no goal set; detection is about the heartbeat timeout, the client's retry back-off adds to served)",
        ["run", "partitions lost", "detection s", "restore s", "kill->restored s", "kill->served s (client)"],
        rows,
    )


def log(message: str) -> None:
    print(f"[migration] {message}", file=sys.stderr, flush=True)


def main() -> None:
    root = tempfile.mkdtemp(prefix="rockstate-bench-migration-")
    try:
        if SIZES_MB:
            moves(root)
        if FAILOVER_RUNS:
            failover(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
