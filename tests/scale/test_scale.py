"""Scale (issue 33): a cluster at P=271 -- Hazelcast's default partition count -- on 4 nodes with backups, through
a join, a kill -9 and a graceful leave under steady reads, writes and compare-and-sets, with the history checker:
no violation and no lost acknowledged write (backup_count=1: a kill loses nothing, so no documented loss either);
and no process's event loop stalled for more than a small fraction of the lease meanwhile. The same at P=1024 on 16
nodes (marker ``scale16``: ``make scale`` runs it, ``make test`` does not)."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rockstate.local.cluster import LocalCluster
from rockstate.testing.history import CAS, READ, WRITE, History, check_history
from rockstate.testing.idle_loop import IdleLoop
from rockstate.testing.workload import Workload, keys_for, read_back

PARTITIONS = 271
HEARTBEAT = 3.0
LEASE = HEARTBEAT / 2  # a node stops serving when it has not heard from the coordinator for this long
STALL = LEASE / 3  # the worst event-loop lag allowed: a third of the lease leaves two heartbeats' margin
START = 600.0  # a loaded 2-core machine (see docs/performance.md)


class PatientCluster(LocalCluster):
    """LocalCluster whose start waits up to START for every backup in sync (its own default is 60 s)."""

    def wait_replicated(self, timeout: float = START) -> dict:
        return super().wait_replicated(timeout)

    def wait_balanced(self, timeout: float = START) -> dict:
        return super().wait_balanced(timeout)


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("nodes, partitions", [(4, PARTITIONS), pytest.param(16, 1024, marks=pytest.mark.scale16)])
def test_a_cluster_through_a_join_a_kill_and_a_leave_under_writes(tmp_path, nodes, partitions):
    history = History()
    with IdleLoop() as idle, PatientCluster(nodes=nodes, partitions=partitions, root=str(tmp_path / "cluster"), heartbeat_timeout=HEARTBEAT,
                      checkpoints=f"file://{tmp_path}/checkpoints", backup_count=1) as cluster:
        peers = peers_of(cluster.wait_replicated(START))
        # a new cluster's primaries replicate to few nodes: half of them to their 2 successors alone, and fewer pairs of
        # nodes in all than backups spread over every node made (each primary to all others); a few partitions'
        # backups may sit on a third node where the balance forces it
        assert sum(len(v) == 2 for v in peers.values()) >= nodes // 2 and sum(map(len, peers.values())) < nodes * (nodes - 1), peers
        with cluster.connect(retry_timeout=60) as admin:
            keys = keys_for(admin)  # one in every partition
            with Workload(cluster, history, keys, timeout=60.0) as load:
                load.wait_ops(20, timeout=120)
                cluster.add_node(wait=False)  # one node more: partitions and backups move to it
                cluster.wait_replicated(START)
                load.wait_ops(20, timeout=120)
                cluster.kill_node(cluster.nodes()[0].node_id)  # kill -9: its backups are promoted
                load.wait_ops(20, timeout=120)
                cluster.wait_replicated(START)
                cluster.stop_node(cluster.nodes()[0].node_id, timeout=START)  # graceful: handovers off it
                cluster.wait_replicated(START)
                load.wait_ops(20, timeout=120)
            read_back(admin, history, keys)
            status = cluster.status()
            lags = loop_lags(cluster, status)
    report = check_history(history)
    kinds = load.kinds()
    print(report, kinds, f"worst event-loop lags {lags}, an idle loop's on this machine meanwhile {idle.worst:.2f}s")
    assert report.ok, str(report)
    assert not report.documented_loss, str(report)
    assert status["partitions"] == partitions and len([n for n in status["nodes"] if n["status"] == "alive"]) == nodes - 1
    assert min(kinds[k] for k in (READ, WRITE, CAS, "batch writes")) > 0, kinds
    # the bound is the cluster's own: beyond what the machine cost an idle loop meanwhile (stalls of every process at once)
    assert len(lags) == nodes and max(lags.values()) < STALL + idle.worst, \
        f"event loops stalled (seconds, the worst of each): {lags}; an idle loop on this machine: {idle.worst:.2f}"


def peers_of(status: dict) -> dict[str, set[str]]:
    """Each primary's backup nodes over all its partitions, from the status document."""
    peers: dict[str, set[str]] = {}
    for replicas in status["replicas"]:
        peers.setdefault(replicas["primary"], set()).update(b["node"] for b in replicas["backups"])
    return peers


def loop_lags(cluster: LocalCluster, status: dict) -> dict[str, float]:
    """The worst event-loop lag so far of the coordinator (its /metrics) and of every live node (its figures)."""
    text = urllib.request.urlopen(cluster.status_url + "metrics", timeout=30).read().decode()
    lags = {"coordinator": s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "rockstate_coordinator_loop_lag_max_seconds"}
    for node in status["nodes"]:
        if node["status"] == "alive" and node.get("figures"):
            lags[node["node_id"]] = node["figures"]["loop_lag_max_seconds"]
    return lags
