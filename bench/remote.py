"""A one-node rockstate cluster vs Redis over loopback, on the same work.

Both servers run as separate OS processes on 127.0.0.1: Debian's
``redis-server`` (no persistence: ``--save "" --appendonly no``) and a
coordinator plus one node of rockstate (16 partitions, a 512 MiB block cache
so that, as in Redis, the data set is in memory), each reached through
its usual Python client (redis-py with hiredis; rockstate's routing client).
Every workload runs once per key kind: the ints 0..N-1 in order, distinct
ints in random order, random UUIDs as 36-character strings, and (tenant id,
int) tuples; Redis gets the same keys as bytes (a tuple's parts joined by ':', the Redis habit). Values
are distinct 100-byte ``bytes``; both sides get their input prebuilt in their
API's natural form (a dict per batch, a list of keys per batch), so only the
calls are timed.

- put, batch 1000: ``put_many(dict)`` vs ``MSET`` of 1000 pairs; keys/s
- get, batch 1000: ``get_many(keys)`` vs ``MGET`` of 1000 keys; keys/s
- get, one key: ``get(key)`` vs ``GET``, after a warm-up; p50 and p99 in µs

Then, on the UUID keys, what bounds any server built as rockstate is, in the
same run: a uvloop echo server (the node's event loop, nothing else) answering
a one-key request's worth of bytes to a blocking Python socket, as the client
sends (the floor of a one-key round trip), and raw rocksdict with the node's
RocksDB options in this process (the floor of a batch's reads and writes).

Both servers run at once and the sides take turns, workload by workload
(one-key gets in alternating chunks), so drift on a shared machine hits both
alike. Throughput is the median of REPEAT runs over all batches. Every run's last
batch, the key counts and every single-key answer are checked against what
was written, so a failing side cannot look fast. Ratios are oriented so that
> 1 always means rockstate is better: rockstate/redis for throughput,
redis/rockstate for latency.

BENCH_REMOTE_BATCHES (default 100) and BENCH_REMOTE_CALLS (default 3000)
shrink the run.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))

import redis  # noqa: E402
from common import COMPARED_KINDS, flat_key, make_keys, median_time, print_table  # noqa: E402
from floors import round_trip_p50_us  # noqa: E402
from rocksdict import Rdict, WriteBatch  # noqa: E402

from rockstate.local.cluster import LocalCluster  # noqa: E402
from rockstate.store.resources import Resources  # noqa: E402

BATCH = 1000
BATCHES = int(os.environ.get("BENCH_REMOTE_BATCHES", "100"))
CALLS = int(os.environ.get("BENCH_REMOTE_CALLS", "3000"))
WARMUP = max(CALLS // 10, 100)
REPEAT = 3
PARTITIONS = 16
VALUE_BYTES = 100
NODE_MEMORY = 512 << 20  # block cache incl. memtables, index and filter blocks: the whole data set fits
REDIS_START_TIMEOUT = 15.0

# Goals from the issue.
GOAL_BATCH_RATIO = 1.0  # rockstate keys/s >= Redis keys/s at batch 1000
GOAL_P50_RATIO = 1.5  # one-key get p50 <= 1.5x Redis GET p50


# -- redis-server as a subprocess ---------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """``redis-server`` on 127.0.0.1 with a free port, without persistence; stopped by its PID."""

    def __init__(self, workdir: str) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise SystemExit("redis-server not found: apt-get install -y redis-server (or run `make bench`)")
        self.exe, self.workdir = exe, workdir
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.log_path = os.path.join(workdir, "redis.log")

    def start(self) -> RedisServer:
        for _ in range(3):  # the free port may be taken between probing it and redis binding it
            self.port = _free_port()
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    [self.exe, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no",
                     "--daemonize", "no", "--protected-mode", "no", "--dir", self.workdir, "--logfile", ""],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                )
            if self._wait_ready():
                return self
            self.stop()
        raise RuntimeError(f"redis-server did not start; see {self.log_path}:\n{self._log_tail()}")

    def _wait_ready(self) -> bool:
        """Poll PING until it answers (True), the process exits (False) or the timeout passes (raises)."""
        probe = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.5, socket_timeout=0.5)
        deadline = time.monotonic() + REDIS_START_TIMEOUT
        try:
            while True:
                if self.proc.poll() is not None:
                    return False
                try:
                    if probe.ping():
                        return True
                except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {self.port} gave no PING reply"
                                       f" within {REDIS_START_TIMEOUT:g}s")
                time.sleep(0.01)  # poll interval; readiness is PING's answer
        finally:
            probe.close()

    def _log_tail(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-20:])
        except OSError:
            return ""

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


# -- the work -----------------------------------------------------------------


class Data:
    """The same keys and values for both sides, prebuilt per batch."""

    def __init__(self, batches: int, kind: str) -> None:
        n = batches * BATCH
        blob = random.Random(42).randbytes(n * VALUE_BYTES)
        self.n = n
        self.values = [blob[i * VALUE_BYTES:(i + 1) * VALUE_BYTES] for i in range(n)]
        keys = make_keys(kind, n)
        ranges = [range(s, s + BATCH) for s in range(0, n, BATCH)]
        self.rs_puts = [{keys[i]: self.values[i] for i in r} for r in ranges]
        self.rs_gets = [[keys[i] for i in r] for r in ranges]
        redis_keys = list(map(flat_key, keys))
        self.redis_puts = [{redis_keys[i]: self.values[i] for i in r} for r in ranges]
        self.redis_gets = [[redis_keys[i] for i in r] for r in ranges]
        self.last_expected = [self.values[i] for i in ranges[-1]]
        order = random.Random(7).sample(range(n), min(n, CALLS + WARMUP))
        self.one = [order[i % len(order)] for i in range(CALLS + WARMUP)]
        self.rs_one = [keys[i] for i in self.one]
        self.redis_one = [redis_keys[i] for i in self.one]


class Side:
    """One system under test: its calls, its inputs, and how many keys it holds."""

    def __init__(self, name: str, put_batch, get_batch, get_one, puts: list, gets: list, one_keys: list, count) -> None:
        self.name, self.put_batch, self.get_batch, self.get_one = name, put_batch, get_batch, get_one
        self.puts, self.gets, self.one_keys, self.count = puts, gets, one_keys, count
        self.samples: list[int] = []


def put_keys_per_s(side: Side) -> float:
    def put_all():
        for batch in side.puts:
            side.put_batch(batch)

    return len(side.puts) * BATCH / median_time(put_all, REPEAT)


def get_keys_per_s(side: Side, expected: list) -> float:
    """Median keys/s of getting every batch; each run's last batch must be what was written."""
    last: list = []

    def get_all():
        for keys in side.gets:
            last[:] = side.get_batch(keys)
        if last != expected:
            raise AssertionError(f"{side.name}: the last get batch differs from what was written")

    return len(side.gets) * BATCH / median_time(get_all, REPEAT)


def one_key_gets(side: Side, start: int, end: int, values: list) -> None:
    """Time calls start..end-1 one by one; every answer is checked; the first WARMUP are not kept."""
    clock, get_one, keys = time.perf_counter_ns, side.get_one, side.one_keys
    for i in range(start, end):
        t0 = clock()
        got = get_one(keys[i])
        took = clock() - t0
        if got != values[i]:
            raise AssertionError(f"{side.name}: get({keys[i]!r}) returned {got!r:.40}, not what was written")
        if i >= WARMUP:
            side.samples.append(took)


def percentiles_us(samples: list[int]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) / 1e3, ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] / 1e3


def run(sides: list[Side], data: Data) -> dict[str, tuple[float, float, float, float]]:
    """Both sides, workload by workload, back to back (one-key calls in alternating chunks)."""
    put = {side.name: put_keys_per_s(side) for side in sides}
    for side in sides:
        count = side.count()
        if count != data.n:
            raise AssertionError(f"{side.name} holds {count} keys, not {data.n}")
    get = {side.name: get_keys_per_s(side, data.last_expected) for side in sides}
    values = [data.values[i] for i in data.one]
    chunk = max(WARMUP, CALLS // 10)
    for start in range(0, len(values), chunk):
        for side in sides:
            one_key_gets(side, start, min(start + chunk, len(values)), values)
    return {side.name: (put[side.name], get[side.name], *percentiles_us(side.samples)) for side in sides}


# -- what bounds any Python server on RocksDB ---------------------------------------


def raw_rocksdb_keys_per_s(data: Data, workdir: str) -> tuple[float, float]:
    """put and get keys/s of raw rocksdict, one DB with the node's options, on Redis's form of the keys."""
    db = Rdict(os.path.join(workdir, "raw"), Resources(NODE_MEMORY).options())
    try:
        def put_all():
            for batch in data.redis_puts:
                wb = WriteBatch(raw_mode=True)
                for key, value in batch.items():
                    wb.put(key, value)
                db.write(wb)

        def get_all():
            for keys in data.redis_gets:
                got = db.get(keys)
            if got != data.last_expected:
                raise AssertionError("raw rocksdict: the last get batch differs from what was written")

        put = data.n / median_time(put_all, REPEAT)
        return put, data.n / median_time(get_all, REPEAT)
    finally:
        db.close()


def main() -> None:
    workdir = tempfile.mkdtemp(prefix="rockstate-bench-redis-")
    server = RedisServer(workdir)
    results = {}
    try:
        server.start()
        # the node's memory holds every key kind's data, as Redis holds it all in memory
        with LocalCluster(nodes=1, partitions=PARTITIONS, node_memory_bytes=NODE_MEMORY) as cluster:
            rs = cluster.connect()
            r = redis.Redis(host="127.0.0.1", port=server.port)
            try:
                for kind in COMPARED_KINDS:
                    data = Data(BATCHES, kind)
                    r.flushall()
                    state = rs.value_state(f"bench-{kind}", create=True)  # defined before the clock starts
                    sides = [
                        Side("redis", r.mset, r.mget, r.get, data.redis_puts, data.redis_gets, data.redis_one, r.dbsize),
                        Side("rockstate", state.put_many, state.get_many, state.get, data.rs_puts, data.rs_gets,
                             data.rs_one, state.count),
                    ]
                    results[kind] = run(sides, data)
                    if kind == "uuid":
                        floors = (round_trip_p50_us(1, CALLS, WARMUP, VALUE_BYTES + 30), *raw_rocksdb_keys_per_s(data, workdir))
            finally:
                r.close()
                rs.close()
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    def met(ok: bool) -> str:
        return "yes" if ok else "NO"

    rows = []
    for kind, result in results.items():
        rs_put, rs_get, rs_p50, rs_p99 = result["rockstate"]
        redis_put, redis_get, redis_p50, redis_p99 = result["redis"]
        rows += [
            [f"{kind}: put batch 1000 (keys/s)", rs_put, redis_put, rs_put / redis_put,
             f">= {GOAL_BATCH_RATIO:.1f}x", met(rs_put / redis_put >= GOAL_BATCH_RATIO)],
            [f"{kind}: get batch 1000 (keys/s)", rs_get, redis_get, rs_get / redis_get,
             f">= {GOAL_BATCH_RATIO:.1f}x", met(rs_get / redis_get >= GOAL_BATCH_RATIO)],
            [f"{kind}: get 1 key p50 (µs)", rs_p50, redis_p50, redis_p50 / rs_p50,
             f">= {1 / GOAL_P50_RATIO:.2f}x", met(rs_p50 <= GOAL_P50_RATIO * redis_p50)],
            [f"{kind}: get 1 key p99 (µs)", rs_p99, redis_p99, redis_p99 / rs_p99, "-", "-"],
        ]
    uuids = results["uuid"]["rockstate"]
    print_table(
        f"remote: 1-node rockstate (P={PARTITIONS}) vs redis-server over loopback, per key kind {BATCHES * BATCH:,} keys x"
        f" {VALUE_BYTES}-byte values; batches: median of {REPEAT} runs over {BATCHES} batches;"
        f" one key: {CALLS:,} calls after {WARMUP:,} warm-up, sides alternating"
        f"\n(ratio > 1 means rockstate is better: rockstate/redis for keys/s, redis/rockstate for µs)",
        ["workload", "rockstate", "redis", "ratio", "goal", "met"],
        rows,
    )
    echo, raw_put, raw_get = floors
    redis_put, redis_get, redis_p50, _ = results["uuid"]["redis"]
    print_table("what bounds any Python server on RocksDB, UUID keys (ratio: the best rockstate could reach against redis)",
                ["floor", "value", "redis", "ratio"],
                [["uvloop echo server, one-key round trip p50 (µs)", echo, redis_p50, redis_p50 / echo],
                 ["raw rocksdict, node's options, put batch 1000 (keys/s)", raw_put, redis_put, raw_put / redis_put],
                 ["raw rocksdict, node's options, get batch 1000 (keys/s)", raw_get, redis_get, raw_get / redis_get]])
    for base in ("int_random", "int"):
        ints = results[base]["rockstate"]
        print(f"rockstate, UUID-string keys vs {base} keys (goal <= 1.2x the cost): put {ints[0] / uuids[0]:.2f}x,"
              f" get {ints[1] / uuids[1]:.2f}x, one-key p50 {uuids[2] / ints[2]:.2f}x")


if __name__ == "__main__":
    main()
