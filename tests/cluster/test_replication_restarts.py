"""Replicated partitions through the chaos run's faults: a node added, an in-sync backup leaving gracefully and its
primary SIGKILLed right after, the coordinator SIGKILLed and restarted, the killed node restarted with its data
directory. Afterwards every partition has a primary and its backups in sync, and takes a write: no election waits on
the node that left, and no primary waits for ever on it. And a node that leaves gracefully, three times over, does
not join again as it exits."""

from __future__ import annotations

import os
import threading
import time

import pytest

from rockstate.local.cluster import wait_until
from rockstate.errors import RockstateError
from rockstate.testing.cluster import gen_cluster

HEARTBEAT_TIMEOUT = 2.0


class Writers:
    """Writes to order ids in every partition until stopped; counts the writes each partition acknowledged."""

    def __init__(self, cluster, keys: list[str]) -> None:
        self.cluster, self.keys, self.done = cluster, keys, {k: 0 for k in keys}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with self.cluster.connect(retry_timeout=5.0, timeout=5.0) as rs:
            orders, n = rs.value_state("orders"), 0
            while not self._stop.is_set():
                n += 1
                for key in self.keys:
                    try:
                        orders.put(key, {"n": n, "at": "2026-11-23T16:00:00Z"})
                        self.done[key] += 1
                    except RockstateError:
                        pass

    def __enter__(self) -> "Writers":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)


def order_keys(rs) -> dict[int, str]:
    """Partition -> an order id in it."""
    keys = {}
    for i in range(10_000):
        keys.setdefault(rs.partition_of(f"order-{i:05d}"), f"order-{i:05d}")
        if len(keys) == rs.partitions:
            return keys
    raise AssertionError("no order id in some partition")


@pytest.mark.timeout(240)
@gen_cluster(nodes=3, partitions=12, heartbeat_timeout=HEARTBEAT_TIMEOUT, backup_count=1, processes=True)
def test_writes_complete_after_node_and_coordinator_restarts(cluster):
    with cluster.connect(retry_timeout=30) as rs:
        keys = order_keys(rs)
        with Writers(cluster, sorted(keys.values())) as writers:
            cluster.add_node()
            cluster.wait_replicated(60)
            wait_until(lambda: min(writers.done.values()) > 0, 30, "a write to every partition")
            # a primary whose in-sync backup leaves gracefully, and which is killed right after
            replica = next(r for r in cluster.status()["replicas"] if r["backups"])
            primary, backup = replica["primary"], replica["backups"][0]["node"]
            cluster.stop_node(backup)
            cluster.kill_node(primary)
        wait_until(lambda: any(n["node_id"] == primary and n["status"] == "dead" for n in cluster.status()["nodes"]),
                   30, f"{primary} declared dead")
        cluster.kill_coordinator()
        time.sleep(1.0)  # the coordinator stays down a while, as in the chaos run
        cluster.restart_coordinator()
        cluster.restart_node(primary)
        cluster.wait_replicated(60)
        # every partition takes a write within a few replica timeouts
        with cluster.connect(retry_timeout=20.0, timeout=10.0) as fresh:
            orders = fresh.value_state("orders")
            for pid, key in sorted(keys.items()):
                started = time.monotonic()
                orders.put(key, {"n": -1, "at": "2026-11-23T17:00:00Z"})
                assert time.monotonic() - started < 15.0, f"partition {pid}: a write took {time.monotonic() - started:.1f}s"
            assert orders.get_many(sorted(keys.values())) == [{"n": -1, "at": "2026-11-23T17:00:00Z"}] * len(keys)


@pytest.mark.timeout(300)
@gen_cluster(nodes=3, partitions=16, heartbeat_timeout=HEARTBEAT_TIMEOUT, backup_count=1, processes=True)
def test_a_node_that_leaves_gracefully_does_not_join_again(cluster):
    """The leaving node heartbeats until it exits; a heartbeat answered "not a member" once the coordinator let it go
    must not register it again: it would be handed partitions and backups as it exits, and its partitions would wait
    for its death to be noticed (or be restored from the checkpoint)."""
    with cluster.connect(retry_timeout=30) as rs:
        keys = order_keys(rs)
        with Writers(cluster, sorted(keys.values())):
            for _ in range(3):
                cluster.add_node()
                cluster.wait_replicated(90)
                leaving = cluster.nodes()[0].node_id
                cluster.stop_node(leaving)
                status = cluster.wait_replicated(90)
                events = [e for e in rs.backend.events() if leaving in (e.get("node"), e.get("source"))]
                names = [e["event"] for e in events]
                assert "member_left" in names, f"{leaving} did not leave: {[e for e in events if e['event'] != 'replica_copied']}"
                after = [e for e in events[names.index("member_left") + 1:] if e.get("node") == leaving]
                assert not after, f"{leaving} after it left: {after}"
                assert {n["node_id"]: n["status"] for n in status["nodes"]}[leaving] == "left", status["nodes"]
        orders = rs.value_state("orders")
        assert all(v is not None for v in orders.get_many(sorted(keys.values())))


@pytest.mark.timeout(180)
@gen_cluster(nodes=3, partitions=8, heartbeat_timeout=HEARTBEAT_TIMEOUT, backup_count=1, processes=True)
def test_a_restarted_nodes_backups_copy_at_once(cluster):
    """A node killed and restarted with its data directory holds no open backup copy: its primaries' streams cannot
    bring them back, a copy must. Each primary reports such a backup at its first send or probe, and the coordinator
    copies it then. Before, a backup left the in-sync set only when its primary's sends timed out, and was copied
    only after STUCK replica timeouts more (~15 s here, the coordinator logging "copies anew"): a window in which
    its partitions had no in-sync backup."""
    with cluster.connect(retry_timeout=60) as rs:
        orders = rs.value_state("orders")
        orders.put_many({f"order-{i:05d}": {"n": i, "at": "2026-11-25T21:00:00Z"} for i in range(2000)})
        cluster.wait_replicated(60)
        victim = cluster.nodes()[1].node_id
        cluster.kill_node(victim)
        cluster.restart_node(victim)
        restarted = time.time()

        def copied_back() -> bool:
            orders.put("order-latest", {"n": -1, "at": "2026-11-25T21:01:00Z"})  # writes go on meanwhile
            status = cluster.status()
            mine = {r["partition"] for r in status["replicas"] if any(b["node"] == victim for b in r["backups"])}
            copied = {e["partition"] for e in status["events"]
                      if e["event"] == "replica_copied" and e["node"] == victim and e["time"] > restarted}
            return bool(mine) and mine <= copied and all(b["in_sync"] for r in status["replicas"] for b in r["backups"])

        wait_until(copied_back, 90, f"the restarted {victim}'s backups copied anew and in sync")
        assert orders.get_many([f"order-{i:05d}" for i in range(2000)]) == [{"n": i, "at": "2026-11-25T21:00:00Z"} for i in range(2000)]
    with open(os.path.join(cluster.root, "logs", "coordinator.log"), errors="replace") as f:
        stuck = [line.strip() for line in f if "copies anew" in line]
    assert not stuck, f"backups copied only once stuck: {stuck[:3]}"
