"""Network partitions between real processes: the coordinator and each node run on a host of their own (a
network namespace on a bridge, ``rockstate.testing.netns``), and links between hosts are cut by dropping their
packets. Clients record single-key reads, writes and compare-and-sets in a history the checker judges: no
linearizability violation (so no split brain: two primaries acknowledging writes for one partition would show as
a lost write or a stale read), no acknowledged write lost, and service back once the links heal."""

from __future__ import annotations

import os
import time
from typing import ContextManager

import pytest

from rockstate.local.cluster import LocalCluster, wait_until
from rockstate.testing.cluster import local_cluster
from rockstate.testing.history import check_history
from rockstate.testing.recording import READ, History
from rockstate.testing.workload import Workload, keys_for, read_back

HEARTBEAT_TIMEOUT = 3.0  # the lease is half of it: a cut-off primary stops serving 1.5 s before it is declared dead


def cluster_on(network, tmp_path, nodes: int) -> ContextManager[LocalCluster]:
    """The coordinator on host "coordinator", node i on host "node<i>"; every partition with one backup."""
    return local_cluster(nodes=nodes, partitions=8, root=str(tmp_path / "cluster"), heartbeat_timeout=HEARTBEAT_TIMEOUT,
                         backup_count=1, hosts=network.place, processes=True)


def host_of(cluster, node_id: str) -> str:
    return os.path.basename(cluster.node(node_id).data_dir)


def replicas(cluster) -> str:
    """The replica sets, compact, for assertion messages."""
    status = cluster.status()
    nodes = {n["node_id"]: n["status"] for n in status["nodes"]}
    sets = [(r["partition"], r["primary"], [(b["node"], b["in_sync"]) for b in r["backups"]], r["waiting_for_election"])
            for r in status["replicas"]]
    return f"nodes {nodes}; replicas (partition, primary, backups in sync, waiting for election) {sets}"


def wait_for(condition, timeout: float, what: str, cluster):
    try:
        return wait_until(condition, timeout, what, interval=0.2)
    except Exception as e:
        raise AssertionError(f"{e}; {replicas(cluster)}") from None


def last_event(cluster) -> int:
    return cluster.status()["events"][-1]["seq"]


def promoted(cluster, after: int, partitions: set) -> list[dict] | None:
    """The ``primary_promoted`` events since ``after`` of these partitions, once every one has one."""
    found = [e for e in cluster.status()["events"] if e["seq"] > after and e["event"] == "primary_promoted"
             and e["partition"] in partitions]
    return found if {e["partition"] for e in found} >= partitions else None


def judge(history: History, cluster) -> None:
    report = check_history(history)
    print(report)
    assert report.ok, str(report)
    events = [e["event"] for e in cluster.status()["events"]]
    assert not report.documented_loss and "partition_restored" not in events, str(report)


@pytest.mark.timeout(180)
def test_a_primary_cut_from_its_backup_goes_on_without_it_and_loses_nothing(tmp_path, network):
    """Two nodes, each the other's backup; the link between them is cut. The coordinator drops the backups
    from the in-sync sets and writes go on at the primaries alone; after the heal the backups catch up: once the
    clients stop, every key reads the same on its backup as on its primary."""
    history = History(clock=time.time)
    with cluster_on(network, tmp_path, nodes=2) as cluster, cluster.connect(retry_timeout=30) as admin:
        keys = keys_for(admin)
        with Workload(cluster, history, keys) as load:
            load.wait_ops(20)
            network.cut("node0", "node1")
            wait_for(lambda: all(not b["in_sync"] for r in cluster.status()["replicas"] for b in r["backups"]), 60,
                     "every backup out of the in-sync sets", cluster)
            dropped = time.time()
            load.wait_ops(20, timeout=60)  # acknowledged by the primaries alone
            network.heal("node0", "node1")
            healed = time.time()
            cluster.wait_replicated(90)  # the backups caught up
            load.wait_ops(10, timeout=60)
        read_back(admin, history, keys)
        with cluster.connect(read_from_backup=True, retry_timeout=30) as stale:
            on_primaries = admin.value_state("register").get_many(keys)
            assert stale.value_state("register").get_many(keys) == on_primaries, replicas(cluster)
        judge(history, cluster)
    during = [o for o in history.operations() if o.status == "ok" and o.kind != READ and dropped < o.call and o.ret < healed]
    assert during, "no write was acknowledged while the backups were cut off"


@pytest.mark.timeout(180)
def test_a_primary_cut_from_the_coordinator_and_its_backups_is_fenced_before_its_backups_are_promoted(tmp_path, network):
    """node0 is cut from the coordinator and from the other nodes; clients on its own host still reach it,
    clients elsewhere reach everything. node0 stops acknowledging (its lease runs out, and its backups are out
    of reach) before the coordinator promotes its backups; the clients elsewhere go on with the promoted
    primaries. After the heal node0 comes back, holds replicas again, and no acknowledged write is lost."""
    history = History(clock=time.time)
    with cluster_on(network, tmp_path, nodes=3) as cluster, cluster.connect(retry_timeout=30) as admin:
        keys = keys_for(admin)
        victim = next(n.node_id for n in cluster.nodes() if host_of(cluster, n.node_id) == "node0")
        lost = set(admin.backend.refresh().owned_by(victim))
        inside = Workload(cluster, history, keys, threads=3, first=10, enter=lambda: network.enter("node0"))
        with Workload(cluster, history, keys, threads=4) as outside, inside:
            outside.wait_ops(20)
            inside.wait_ops(10)
            after = last_event(cluster)
            cut = time.time()
            network.isolate("node0", "coordinator", "node1", "node2")
            promotions = wait_for(lambda: promoted(cluster, after, lost), 60, f"{victim}'s partitions {sorted(lost)} promoted",
                                  cluster)
            outside.wait_ops(20, timeout=60)  # the promoted primaries serve
            healed = time.time()
            network.heal_all()
            wait_for(lambda: any(n["node_id"] == victim and n["status"] == "alive" for n in cluster.status()["nodes"]), 60,
                     f"{victim} back", cluster)
            status = cluster.wait_replicated(90)
            holds = [r["partition"] for r in status["replicas"] if victim in (r["primary"], *(b["node"] for b in r["backups"]))]
            assert holds, f"{victim} holds no replica after the heal: {replicas(cluster)}"
            inside.wait_ops(5, timeout=60)
            outside.wait_ops(10, timeout=60)
        read_back(admin, history, keys)
        judge(history, cluster)
    promoted_at = min(e["time"] for e in promotions)
    inside_ops = [o for o in history.operations() if o.process in range(10, 13) and cut < o.ret < healed]
    print(f"on node0's host while it was cut off: {len(inside_ops)} operations answered, the last "
          f"{max((o.ret for o in inside_ops), default=cut) - cut:.2f} s after the cut; promoted {promoted_at - cut:.2f} s after")
    fenced_late = [str(o) for o in inside_ops if o.ret >= promoted_at]
    assert not fenced_late, f"node0 acknowledged after its backups were promoted ({promoted_at:.3f}): {fenced_late[:5]}"


def answered(history: History, keys: set, since: float) -> int:
    """Operations on ``keys`` that completed ok after ``since``."""
    return sum(1 for o in history.operations() if o.status == "ok" and o.key in keys and o.call > since)


@pytest.mark.timeout(180)
def test_a_client_cut_from_a_primary_changes_nothing_in_the_cluster_and_is_served_again_after_the_heal(tmp_path, network):
    """Clients on a host of their own lose their link to node0 only: their operations on node0's partitions
    fail or time out (never answered wrongly), those on the other node's go on; the cluster itself sees nothing
    (no death, no promotion: one client's view is no reason to move a partition). After the heal the same
    clients are served by node0 again, and no acknowledged write is lost."""
    history = History(clock=time.time)
    with cluster_on(network, tmp_path, nodes=2) as cluster, cluster.connect(retry_timeout=30) as admin:
        keys = keys_for(admin, per_partition=2)
        node0 = next(n.node_id for n in cluster.nodes() if host_of(cluster, n.node_id) == "node0")
        table = admin.backend.refresh()
        on_node0 = {k for k in keys if table.owners[admin.partition_of(k)] == node0}
        elsewhere = set(keys) - on_node0
        assert on_node0 and elsewhere, table.owners
        network.host("client")
        # 3 s client timeouts: a thread that picked one of node0's keys during the cut gives up sooner
        with Workload(cluster, history, keys, threads=4, enter=lambda: network.enter("client"), timeout=3.0) as clients:
            clients.wait_ops(10, timeout=60)
            after = last_event(cluster)
            cut = time.time()
            network.cut("client", "node0")
            wait_for(lambda: answered(history, elsewhere, cut) >= 8, 90, "8 operations on the other node's keys", cluster)
            print(f"during the cut: {answered(history, elsewhere, cut)} answered on the other node in {time.time() - cut:.1f} s")
            # a write sent to node0 just before the cut may still be answered; nothing asked after it
            assert answered(history, on_node0, cut + 0.5) == 0, "node0 answered clients that cannot reach it"
            events = [e for e in cluster.status()["events"] if e["seq"] > after]
            assert not [e for e in events if e["event"] in ("member_dead", "primary_promoted", "partition_restored")], events
            healed = time.time()
            network.heal("client", "node0")
            wait_for(lambda: answered(history, on_node0, healed) >= 10, 60, "node0 serving the cut clients again", cluster)
            clients.wait_ops(3, timeout=60)
        read_back(admin, history, keys)
        judge(history, cluster)
