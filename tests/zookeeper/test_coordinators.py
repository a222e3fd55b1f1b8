"""Three coordinators on a real ZooKeeper, every part a real process: the leader killed with SIGKILL at the worst moments.

Sessions last 1.5 s (LocalCluster's default with ZooKeeper); the heartbeat
timeout is 4 s, so a node's lease (2 s) outlasts a takeover and the data
path only waits.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
import uuid
from typing import ContextManager

import pytest

from rockstate import LocalCluster, connect
from rockstate.cli import main
from rockstate.cluster import protocol as p
from rockstate.local.cluster import wait_until
from rockstate.files import read_json
from rockstate.rpc.client import Channel
from rockstate.testing.history import History, check_history
from rockstate.testing.workload import Workload, keys_for
from rockstate.testing.cluster import local_cluster

SESSION = 1.5


def ha_cluster(tmp_path, zookeeper, nodes: int = 3, **options) -> ContextManager[LocalCluster]:
    return local_cluster(nodes=nodes, partitions=8, root=str(tmp_path / "cluster"), zookeeper=zookeeper.hosts,
                         zookeeper_session_timeout=SESSION, heartbeat_timeout=4.0, processes=True,
                         coordinator_settings={"cluster_name": f"ha-{uuid.uuid4().hex[:8]}"}, **{"coordinators": 3, **options})


def new_leader(cluster: LocalCluster, killed: int, timeout: float) -> None:
    """Until a coordinator other than ``killed`` leads and answers (how soon: bench/coordinator_failover.py)."""
    wait_until(lambda: cluster.status()["coordinators"]["leader"] not in (None, cluster.coordinator_addresses[killed]),
               timeout, "a standby to lead")


def owners_as_the_nodes_see_them(cluster: LocalCluster) -> dict[int, list[str]]:
    """Each partition with every node that holds itself its owner: never more than one."""
    owners: dict[int, list[str]] = {}
    for node in cluster.nodes():
        with Channel(node.address) as channel:
            for pid in channel.call(p.NodeStats())["partitions"]:
                owners.setdefault(int(pid), []).append(node.node_id)
    return owners


def owners_once_applied(cluster: LocalCluster) -> dict[int, list[str]]:
    """The owners as the nodes see them once every partition has one: a node may apply the coordinator's last
    table a moment after the coordinator reports it; at no moment may a partition have two owners."""
    def settled() -> dict[int, list[str]] | None:
        owners = owners_as_the_nodes_see_them(cluster)
        assert all(len(o) == 1 for o in owners.values()), owners
        return owners if sorted(owners) == list(range(8)) else None
    return wait_until(settled, 10, "every partition served by one node")


def standby_names(status_url: str) -> str | None:
    """The leader a standby's status API names (it answers 503: its own state is not the cluster's)."""
    with pytest.raises(urllib.error.HTTPError) as answer:
        urllib.request.urlopen(status_url + "api/status", timeout=10)
    assert answer.value.code == 503
    return json.load(answer.value)["coordinators"]["leader"]


def events_of(cluster: LocalCluster) -> list[str]:
    return [e["event"] for e in cluster.status()["events"]]


@pytest.mark.timeout(120)
def test_kill_9_of_the_leader_under_steady_writes_a_standby_leads_and_nothing_is_violated(tmp_path, zookeeper):
    history = History()
    with ha_cluster(tmp_path, zookeeper) as cluster, cluster.connect() as admin:
        keys = keys_for(admin)
        epoch = cluster.status()["epoch"]
        with Workload(cluster, history, keys) as load:
            load.wait_ops(30)
            killed = cluster.kill_leader()
            new_leader(cluster, killed, SESSION + 5)
            load.wait_ops(30)  # the clients followed the new leader, and the nodes kept serving
        status = cluster.status()
        survivors = [a for i, a in enumerate(cluster.coordinator_addresses) if i != killed]
        assert sorted([status["coordinators"]["leader"], *status["coordinators"]["standbys"]]) == sorted(survivors)
        assert [n["status"] for n in status["nodes"]] == ["alive"] * 3  # every node heartbeats to the new leader
        wait_until(lambda: "coordinator_resumed" in events_of(cluster), 10, "the new leader to resume")
        assert cluster.status()["epoch"] > epoch and "member_dead" not in events_of(cluster)
    report = check_history(history.operations())
    assert report.ok, report.violations[:3]
    assert load.kinds()["write"] > 0


@pytest.mark.timeout(120)
def test_the_leader_killed_mid_move_the_new_leader_finishes_and_no_partition_has_two_owners(tmp_path, zookeeper):
    orders = {str(uuid.UUID(int=i)): {"amount": f"{i}.{i % 100:02d}", "placed": f"2026-11-{1 + i % 28:02d}"} for i in range(3000)}
    with ha_cluster(tmp_path, zookeeper, nodes=1) as cluster, cluster.connect() as rs:
        rs.value_state("orders").put_many(orders)
        cluster.add_node(wait=False)  # half the partitions move to it
        wait_until(lambda: "migration_started" in events_of(cluster), 20, "a move to begin")
        killed = cluster.kill_leader()
        new_leader(cluster, killed, SESSION + 5)
        cluster.wait_balanced(30)
        owners = owners_once_applied(cluster)
        assert sorted(owners) == list(range(8)) and all(len(o) == 1 for o in owners.values()), owners
        assert rs.value_state("orders").get_many(list(orders)) == list(orders.values())
        assert {n["status"] for n in cluster.status()["nodes"]} == {"alive"}
        with connect(f"zk://{zookeeper.hosts}/{cluster.coordinator_settings['cluster_name']}") as found:  # found through ZooKeeper
            assert found.value_state("orders").get_many(list(orders)[:100]) == list(orders.values())[:100]


@pytest.mark.timeout(120)
def test_the_leader_killed_mid_failover_the_new_leader_restores_and_no_partition_has_two_owners(tmp_path, zookeeper):
    orders = {("customer", i): {"order": str(uuid.UUID(int=i)), "amount": f"{i}.50"} for i in range(2000)}
    with ha_cluster(tmp_path, zookeeper, checkpoints=f"file://{tmp_path}/checkpoints",
                    backup_count=0) as cluster, cluster.connect() as rs:  # the checkpoint failover, without backups
        rs.value_state("orders").put_many(orders)
        rs.checkpoint()
        victim = cluster.nodes()[0].node_id
        cluster.kill_node(victim)
        wait_until(lambda: "member_dead" in events_of(cluster), 20, "the node to be declared dead")
        killed = cluster.kill_leader()  # its partitions are being restored elsewhere, or about to be
        new_leader(cluster, killed, SESSION + 5)
        wait_until(lambda: not cluster.status()["failovers"] and cluster.status()["unavailable"] == 0, 30,
                   "the new leader to finish the failover")
        owners = owners_once_applied(cluster)
        assert sorted(owners) == list(range(8)) and all(len(o) == 1 and o != [victim] for o in owners.values()), owners
        assert rs.value_state("orders").get_many(list(orders)) == list(orders.values())  # all in the checkpoint


@pytest.mark.timeout(120)
def test_a_zookeeper_restart_loses_nothing_and_the_cluster_serves_again(tmp_path, capsys):
    orders = {f"order-{i:05d}": {"amount": f"{i}.25"} for i in range(500)}
    with local_cluster(processes=True, nodes=2, partitions=8, root=str(tmp_path / "cluster"), coordinators=3, zookeeper=True,
                      zookeeper_session_timeout=SESSION, heartbeat_timeout=4.0) as cluster, cluster.connect() as rs:
        state = rs.value_state("orders")
        state.put_many(orders)
        leader, epoch = cluster.status()["coordinators"]["leader"], cluster.status()["epoch"]
        elections = events_of(cluster).count("coordinator_elected")
        cluster.zookeeper_server.restart(kill=True)
        later = {f"order-{i:05d}": {"amount": f"{i}.75"} for i in range(500, 800)}
        state.put_many(later)  # the data path waits at most while leases lapse, then serves
        # the leader lost touch, stopped, and led again after loading the documents (or a standby did)
        wait_until(lambda: events_of(cluster).count("coordinator_elected") > elections, 20, "a coordinator to lead again")
        # the old leader rejoins the election once its new ZooKeeper session is up: it leads or stands by
        wait_until(lambda: leader in [cluster.status()["coordinators"]["leader"], *cluster.status()["coordinators"]["standbys"]],
                   20, f"{leader} to lead or stand by again")
        status = cluster.status()
        assert status["epoch"] >= epoch and status["coordinators"]["leader"] in cluster.coordinator_addresses
        assert state.get_many(list({**orders, **later})) == list({**orders, **later}.values())
        capsys.readouterr()
        main(["status", "--coordinator", cluster.address])  # the operator's view names them too
        assert f"leader {status['coordinators']['leader']}" in " ".join(capsys.readouterr().out.split())
        standby = cluster.coordinator_addresses.index(status["coordinators"]["standbys"][0])
        url = read_json(os.path.join(cluster.root, f"coordinator{standby or ''}", "address.json"))["status_url"]
        wait_until(lambda: standby_names(url) == status["coordinators"]["leader"], 10,  # once it is back in touch
                   "the standby's status page to name the leader")


@pytest.mark.timeout(120)
def test_zookeeper_away_for_longer_than_a_session_the_data_path_waits_and_nobody_is_declared_dead(tmp_path):
    """Every process cut off from ZooKeeper: the leader stops renewing leases at once (it may have been
    replaced), the nodes stop serving when theirs run out, and all of it comes back with ZooKeeper."""
    orders = {("customer", i): {"amount": f"{i}.10", "placed": "2026-11-23T10:00:00Z"} for i in range(400)}
    with local_cluster(processes=True, nodes=2, partitions=8, root=str(tmp_path / "cluster"), coordinators=3, zookeeper=True,
                      zookeeper_session_timeout=SESSION, heartbeat_timeout=4.0) as cluster, cluster.connect() as rs:
        state = rs.value_state("orders")
        state.put_many(orders)
        cluster.zookeeper_server.stop(kill=True)
        time.sleep(3 * SESSION)  # the outage itself: longer than a session and a node's lease
        cluster.zookeeper_server.start()
        later = {("customer", i): {"amount": f"{i}.20"} for i in range(400, 600)}
        state.put_many(later)  # waits (at most retry_timeout) for a leader to renew the nodes' leases
        assert state.get_many(list({**orders, **later})) == list({**orders, **later}.values())
        events = events_of(cluster)
        assert "member_dead" not in events and "partition_restored" not in events
        owners = owners_as_the_nodes_see_them(cluster)
        assert sorted(owners) == list(range(8)) and all(len(o) == 1 for o in owners.values()), owners


@pytest.mark.timeout(180)
def test_a_three_server_ensemble_with_one_server_killed_keeps_the_cluster_serving_and_electing(tmp_path):
    from rockstate.local.zookeeper import ZooKeeperEnsemble

    orders = {("customer", i): {"amount": f"{i}.30", "placed": "2026-11-23T11:00:00Z"} for i in range(300)}
    with ZooKeeperEnsemble(str(tmp_path / "ensemble")) as ensemble, \
            local_cluster(processes=True, nodes=2, partitions=8, root=str(tmp_path / "cluster"), coordinators=3, zookeeper=ensemble.hosts,
                         zookeeper_session_timeout=SESSION, heartbeat_timeout=4.0) as cluster, cluster.connect() as rs:
        state = rs.value_state("orders")
        state.put_many(orders)
        ensemble.servers[0].stop(kill=True)  # two of three still make a quorum; sessions on it move to the others
        later = {("customer", i): {"amount": f"{i}.40"} for i in range(300, 450)}
        state.put_many(later)
        killed = cluster.kill_leader()  # and the survivors of the ensemble still elect a new leader
        new_leader(cluster, killed, SESSION + 10)
        state.put_many({("customer", 0): {"amount": "0.50"}})
        expected = {**orders, **later, ("customer", 0): {"amount": "0.50"}}
        assert state.get_many(list(expected)) == list(expected.values())
        owners = owners_as_the_nodes_see_them(cluster)
        assert sorted(owners) == list(range(8)) and all(len(o) == 1 for o in owners.values()), owners


@pytest.mark.timeout(120)
def test_a_leader_cut_off_from_zookeeper_but_not_from_the_nodes_steps_down_and_the_nodes_follow_its_successor(tmp_path, zookeeper):
    from tests.cluster.test_partition import Link

    orders = {str(uuid.UUID(int=i)): {"amount": f"{i}.60", "placed": "2026-11-23"} for i in range(300)}
    link = Link(zookeeper.hosts)  # one coordinator reaches ZooKeeper only through this
    try:
        with ha_cluster(tmp_path, zookeeper, nodes=2, coordinators=2) as cluster, cluster.connect() as rs:
            state = rs.value_state("orders")
            state.put_many(orders)
            linked = cluster.leader()
            cluster.kill_coordinator(linked)
            cluster.restart_coordinator(linked, zookeeper=link.address)  # back as the standby, through the link
            cluster.restart_coordinator(cluster.kill_leader())  # it leads now; the other stands by
            wait_until(lambda: cluster.leader() == linked, 10, "the linked coordinator to lead")
            wait_until(lambda: "coordinator_resumed" in events_of(cluster)[-5:], 15, "it to resume")
            epoch = cluster.status()["epoch"]

            link.cut()  # the leader loses ZooKeeper, but nodes and clients still reach it
            new_leader(cluster, linked, SESSION + 5)
            later = {str(uuid.UUID(int=i)): {"amount": f"{i}.70"} for i in range(300, 400)}
            state.put_many(later)  # the nodes heartbeat to the successor: their leases are renewed there
            wait_until(lambda: cluster.status()["epoch"] > epoch, 15, "the successor to publish its table")
            events = events_of(cluster)
            assert "member_dead" not in events and {n["status"] for n in cluster.status()["nodes"]} == {"alive"}
            assert state.get_many(list({**orders, **later})) == list({**orders, **later}.values())
            owners = owners_as_the_nodes_see_them(cluster)
            assert sorted(owners) == list(range(8)) and all(len(o) == 1 for o in owners.values()), owners
            link.heal()  # its session expired meanwhile: it comes back as a standby
            wait_until(lambda: cluster.coordinator_addresses[linked] in cluster.status()["coordinators"]["standbys"], 15,
                       "the cut-off coordinator to stand by")
    finally:
        link.close()
