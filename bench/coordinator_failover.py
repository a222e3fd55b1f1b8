"""Coordinator failover: kill -9 of the leading coordinator, until a client sees the next table.

Two set-ups side by side on this machine, each a multi-process LocalCluster of
3 nodes, P=16, heartbeat_timeout 4 s:

- ``3 coordinators + ZooKeeper``: the leader is killed with SIGKILL; a standby
  is elected when its ZooKeeper session (BENCH_FAILOVER_SESSION, default
  1.5 s) expires, loads the documents, and publishes a new epoch once every
  node has checked in with it. The killed one is started again (it stands by)
  before the next run.
- ``1 coordinator, restarted``: today's recovery without ZooKeeper: the only
  coordinator is killed and started again at once on its data directory, as a
  supervisor (systemd's Restart=always) would.

Measured per run: from the kill to the first table whose epoch is newer than
the one before it, as a client (``ClusterBackend.refresh``, polled every
20 ms) sees it. Meanwhile writer and reader threads (values with a date and
a decimal amount) keep calling put_many and get_many on every partition, one
thread per key kind (ints, UUID strings, (tenant, int) tuples); a call that
raises counts as failed (clients retry for up to 30 s: a call that only
waited is not a failure), and the slowest call is reported.
Medians of BENCH_FAILOVER_RUNS (default 5) runs. Goal: HA <= session timeout
+ 1 s, and no failed data-path call.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))

from common import key_of, print_table  # noqa: E402

from rockstate.cluster.client.backend import ClusterBackend  # noqa: E402
from rockstate.local.cluster import LocalCluster, wait_until  # noqa: E402
from rockstate.errors import RockstateError  # noqa: E402

RUNS = int(os.environ.get("BENCH_FAILOVER_RUNS", "5"))
SESSION = float(os.environ.get("BENCH_FAILOVER_SESSION", "1.5"))
KINDS = ("int", "uuid", "tuple")  # one writer-reader thread per key kind: ints, UUID strings, (tenant, int)
KEYS = {kind: [key_of(kind, i) for i in range(2000)] for kind in KINDS}


class DataPath:
    """Threads writing and reading on every partition; counts calls, failures and the slowest call."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster, self.calls, self.failed, self.slowest = cluster, 0, [], 0.0
        self.by_kind = dict.fromkeys(KINDS, 0)  # calls
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(t, kind), daemon=True) for t, kind in enumerate(KINDS)]

    def _run(self, t: int, kind: str) -> None:
        keys = KEYS[kind]
        with self.cluster.connect(retry_timeout=30.0) as rs:
            state, n = rs.value_state(f"orders_{kind}"), 0
            while not self._stop.is_set():
                n += 1
                batch = keys[(n * 50) % len(keys):][:50]
                started = time.monotonic()
                try:
                    if n % 2:
                        state.put_many({k: {"placed": "2026-11-23", "amount": f"{n}.{t:02d}"} for k in batch})
                    else:
                        state.get_many(batch)
                except RockstateError as e:
                    self.failed.append(f"{kind}: {e!r}")
                self.calls += 1
                self.by_kind[kind] += 1
                self.slowest = max(self.slowest, time.monotonic() - started)

    def __enter__(self) -> "DataPath":
        for th in self._threads:
            th.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for th in self._threads:
            th.join(60)


def until_new_table(backend: ClusterBackend, epoch: int, since: float) -> float:
    while True:
        try:
            if backend.refresh().epoch > epoch:
                return time.monotonic() - since
        except RockstateError:
            pass
        time.sleep(0.02)


def run(ha: bool) -> tuple[list[float], int, int, float, list[str]]:
    options = {"coordinators": 3, "zookeeper": True, "zookeeper_session_timeout": SESSION} if ha else {}
    times = []
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as root, \
            LocalCluster(nodes=3, partitions=16, root=root, heartbeat_timeout=4.0, **options) as cluster:
        backend = ClusterBackend(cluster.address, retry_timeout=60.0, wait=True)
        with DataPath(cluster) as load:
            wait_until(lambda: load.calls > 20, 30, "the data path to run")
            for _ in range(RUNS):
                epoch = backend.refresh().epoch
                killed_at = time.monotonic()
                index = cluster.kill_leader() if ha else (cluster.kill_coordinator(), 0)[1]
                if not ha:
                    cluster.restart_coordinator()
                times.append(until_new_table(backend, epoch, killed_at))
                if ha:  # back to three: it stands by
                    cluster.restart_coordinator(index)
                    wait_until(lambda: cluster.coordinator_addresses[index] in cluster.status()["coordinators"]["standbys"],
                               30, "the restarted coordinator to stand by")
                calls = load.calls
                wait_until(lambda: load.calls > calls + 10, 30, "the data path to go on")
        backend.close()
    print(f"data-path calls by key kind ({'HA' if ha else 'restart'}): "
          + ", ".join(f"{kind} {calls} ({sum(f.startswith(kind + ':') for f in load.failed)} failed)" for kind, calls in load.by_kind.items()))
    return times, load.calls, len(load.failed), load.slowest, load.failed


def main() -> None:
    ha, single = run(ha=True), run(ha=False)
    rows = []
    for name, (times, calls, failed, slowest, _) in (("3 coordinators + ZooKeeper", ha), ("1 coordinator, restarted", single)):
        rows.append([name, len(times), statistics.median(times), min(times), max(times), calls, failed, slowest])
    print_table(f"coordinator failover: kill -9 of the leader -> first new table a client sees "
                f"(3 nodes, P=16, heartbeat_timeout 4 s, ZooKeeper session {SESSION:g} s)",
                ["set-up", "runs", "median s", "min s", "max s", "data-path calls", "failed", "slowest call s"], rows)
    for name, result in (("HA", ha), ("restart", single)):
        for failure in sorted(set(result[4]))[:5]:
            print(f"failed ({name}): {failure}")
    goal = SESSION + 1.0
    print(f"HA median / restart median: {statistics.median(ha[0]) / statistics.median(single[0]):.2f}; "
          f"goal (HA median <= {goal:g} s, no failed call): {'met' if statistics.median(ha[0]) <= goal and not ha[2] else 'NOT met'}")


if __name__ == "__main__":
    main()
