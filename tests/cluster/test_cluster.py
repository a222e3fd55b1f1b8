"""Real clusters on loopback: a coordinator and nodes as OS processes (or in-process where noted)."""

import os
import subprocess
import sys
import time
import urllib.request

import pytest

from rockstate.cluster import protocol as p
from rockstate.cluster.client.backend import ClusterBackend
from rockstate.local.cluster import LocalCluster, wait_until
from rockstate.errors import ClusterTimeoutError, InvalidKeyError, NotOwnerError, ProtocolError, StateKindError, UnknownStateError
from rockstate.rpc.client import Channel
from rockstate.testing.cluster import gen_cluster, local_cluster


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it is dead for our purposes
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with local_cluster(processes=True, nodes=3, partitions=16, root=str(tmp_path_factory.mktemp("cluster"))) as c:
        yield c


def test_routing_puts_each_key_on_its_owner(cluster):
    with cluster.connect() as rs:
        s = rs.value_state("routing")
        s.put_many({i: f"v{i}" for i in range(3000)})
        assert s.get_many(range(3000)) == [f"v{i}" for i in range(3000)]
        assert s.get(42) == "v42" and 42 in s and 5000 not in s
        stats = rs.stats()
        assert stats["states"]["routing"]["keys"] == 3000
        assert sum(n["keys"] for n in stats["nodes"].values() if n) >= 3000
        table = rs.backend.table
        # every partition's keys live on the node the table names, and only there
        for pid, row in stats["partitions"].items():
            assert row["node"] == table.owners[pid]
        per_node = {}
        for i in range(3000):
            owner = table.owners[rs.partition_of(i)]
            per_node[owner] = per_node.get(owner, 0) + 1
        routing_keys = {n: 0 for n in per_node}
        for pid, row in stats["partitions"].items():
            routing_keys[row["node"]] = routing_keys.get(row["node"], 0) + 0
        assert len(per_node) == 3  # the keys spread over all three nodes


def test_scan_count_map_and_list_state_over_the_network(cluster):
    with cluster.connect() as rs:
        m = rs.map_state("net-map")
        m.put_all("user", {f"f{i}": i for i in range(2500)})  # more than one scan page
        assert dict(m.items("user")) == {f"f{i}": i for i in range(2500)}
        m.clear("user")
        assert list(m.items("user")) == []
        lst = rs.list_state("net-list")
        lst.extend("k", [1, 2, 3])
        lst.append("k", 4)
        assert lst.get("k") == [1, 2, 3, 4]
        v = rs.value_state("net-count")
        v.put_many({("a", i): i for i in range(1200)})
        assert v.count() == 1200
        assert sorted(v.keys()) == sorted(("a", i) for i in range(1200))


def test_scan_many_pages_every_partition_with_one_request_per_owner(cluster):
    """``scan_many``: a page of each partition up to a stop key, as ``scan`` gives it; a bad page is refused."""
    with cluster.connect() as rs:
        backend = rs.backend
        rs.value_state("net-pages").put_many({f"order-{i:05d}": i for i in range(3000)})
        pids = range(backend.partitions)
        whole = {pid: backend.scan("net-pages", pid, b"", None, 5000) for pid in pids}
        stop = sorted(k for page in whole.values() for k, _ in page)[1500]
        pages = backend.scan_many("net-pages", {pid: (b"", None, stop, 5000) for pid in pids})
        assert {pid: list(zip(*page)) for pid, page in pages.items()} == {pid: [e for e in whole[pid] if e[0] < stop] for pid in pids}
        assert sum(len(keys) for keys, _ in pages.values()) == 1500
        first = next(pid for pid in pids if len(whole[pid]) > 3)
        after = whole[first][0][0]
        keys, values = backend.scan_many("net-pages", {first: (b"", after, None, 2)})[first]
        assert list(zip(keys, values)) == whole[first][1:3]
        table = backend.refresh()  # a client from before the optional `columns` field gets pairs, as it did
        old = backend._channel(table.owner_address(first)).call(
            p.ScanMany(epoch=table.epoch, state="net-pages", groups=[[first, [b"", after, None, 2]]]))
        assert [tuple(entry) for entry in old[0]] == whole[first][1:3]
        with pytest.raises(ProtocolError, match="scan_many"):
            backend.scan_many("net-pages", {first: (b"", None, None, 0)})
        assert backend.scan("net-pages", first, b"", None, 1) == whole[first][:1]  # still serving


def test_errors_cross_the_wire_as_their_own_types(cluster):
    with cluster.connect() as rs:
        rs.value_state("typed").put(1, 1)
        with pytest.raises(StateKindError, match="is a value state"):
            rs.map_state("typed")
        with pytest.raises(InvalidKeyError):
            rs.value_state("typed").put([1], 1)
        with pytest.raises(UnknownStateError):
            rs.backend.count("no-such-state")
        assert rs.value_state("typed").get(1) == 1  # the node kept serving


def test_stale_epoch_is_fenced(cluster):
    with cluster.connect() as rs:
        rs.value_state("fence").put("k", 1)
        table = rs.backend.table
        pid = rs.partition_of("k")
        owner = table.owner_address(pid)
        channel = Channel(owner)
        try:
            with pytest.raises(NotOwnerError) as info:
                channel.call(p.Read(epoch=table.since[pid] - 1, state="fence", pids=[pid], counts=[1], keys=[b"\xa1k"]))
            assert info.value.data["epoch"] == table.epoch
            other = next(a for n, a in table.addresses.items() if a != owner and n in table.owners)
            with pytest.raises(NotOwnerError, match="does not own partition"):
                Channel(other).call(p.Read(epoch=table.epoch, state="fence", pids=[pid], counts=[1], keys=[b"\xa1k"]))
        finally:
            channel.close()


@gen_cluster(nodes=2, partitions=12, processes=True)
def test_join_moves_partitions_and_clients_follow_redirects(cluster):
    writer = cluster.connect()
    reader = cluster.connect()
    s = writer.value_state("moving")
    s.put_many({i: i for i in range(2000)})
    old_epoch = reader.backend.table.epoch
    info = cluster.add_node()
    status = cluster.wait_balanced()
    assert sorted(n["partitions"] for n in status["nodes"]) == [4, 4, 4]
    # the reader still has the old table: its requests are redirected, and it learns the new one
    assert reader.value_state("moving").get_many(range(2000)) == list(range(2000))
    assert reader.backend.table.epoch > old_epoch
    assert info.node_id in reader.backend.table.owners
    assert writer.stats()["nodes"][info.node_id]["keys"] > 0
    def moves_to_new_node():
        moved = [e for e in cluster.status()["events"] if e["event"] == "migration_finished" and e["target"] == info.node_id]
        return moved if len(moved) >= 4 else None

    moved = wait_until(moves_to_new_node, 10, "the four moves' events")
    assert len(moved) == 4 and all(e["bytes"] > 0 for e in moved)
    assert all(e["write_blocked_seconds"] < e["seconds"] for e in moved)
    writer.close()
    reader.close()


@gen_cluster(nodes=3, partitions=9, processes=True)
def test_graceful_stop_hands_partitions_over(cluster):
    with cluster.connect() as rs:
        s = rs.value_state("handover")
        s.put_many({i: str(i) for i in range(3000)})
        victim = cluster.nodes()[0]
        cluster.stop_node(victim.node_id)
        assert not pid_alive(victim.pid)
        status = cluster.wait_balanced()
        assert {n["node_id"]: n["status"] for n in status["nodes"]}[victim.node_id] == "left"
        assert victim.node_id not in rs.backend.refresh().owners
        assert s.get_many(range(3000)) == [str(i) for i in range(3000)]
        assert s.count() == 3000


@gen_cluster(nodes=2, partitions=8, heartbeat_timeout=1.0, backup_count=0, processes=True)
def test_killed_node_is_declared_dead_and_returns_with_its_data(cluster):
    with cluster.connect(retry_timeout=1.0) as rs:
        s = rs.value_state("durable")
        s.put_many({i: i for i in range(500)})
        victim = cluster.nodes()[0]
        lost = [i for i in range(500) if rs.backend.table.owners[rs.partition_of(i)] == victim.node_id]
        cluster.kill_node(victim.node_id)
        wait_until(lambda: any(n["status"] == "dead" for n in cluster.status()["nodes"]), 10, "the node declared dead")
        with pytest.raises(ClusterTimeoutError, match="gave up"):
            s.get(lost[0])  # a clear, retryable error within the client's bound
        assert s.get_many([i for i in range(500) if i not in lost][:50]) == [i for i in range(500) if i not in lost][:50]
        back = cluster.restart_node(victim.node_id)
        assert back.node_id == victim.node_id and back.pid != victim.pid
        wait_until(lambda: all(n["status"] == "alive" for n in cluster.status()["nodes"]), 10, "the node back")
        assert s.get_many(lost) == lost


@gen_cluster(nodes=2, partitions=8, processes=True)
def test_coordinator_restart_resumes_the_same_table(cluster):
    with cluster.connect() as rs:
        rs.value_state("kept").put_many({i: i for i in range(100)})
        before = rs.backend.refresh()
    old_pid = cluster._runner.coordinators[0].pid
    cluster.kill_coordinator()
    assert not pid_alive(old_pid)
    cluster.restart_coordinator()
    with cluster.connect() as rs:
        after = rs.backend.table
        assert after.owners == before.owners and after.epoch >= before.epoch
        assert rs.value_state("kept").get_many(range(100)) == list(range(100))
        wait_until(lambda: all(n["status"] == "alive" for n in cluster.status()["nodes"]), 10, "nodes checked in")


def test_no_process_outlives_the_cluster(tmp_path):
    with LocalCluster(nodes=2, partitions=4, root=str(tmp_path)) as cluster:
        pids = [n.pid for n in cluster.nodes()] + [cluster._runner.coordinators[0].pid]
        assert all(pid_alive(pid) for pid in pids)
    assert not any(pid_alive(pid) for pid in pids)


def test_cleanup_after_a_failing_test_body(tmp_path):
    pids = []
    with pytest.raises(RuntimeError):
        with LocalCluster(nodes=1, partitions=2, root=str(tmp_path)) as cluster:
            pids = [cluster.nodes()[0].pid, cluster._runner.coordinators[0].pid]
            raise RuntimeError("test failed")
    assert pids and not any(pid_alive(pid) for pid in pids)


@gen_cluster(nodes=2, partitions=4)
def test_in_process_cluster_serves_the_same_api(cluster):
    with cluster.connect() as rs:
        s = rs.value_state("inproc")
        s.put_many({i: [i] for i in range(100)})
        assert s.get_many(range(100)) == [[i] for i in range(100)]
        cluster.add_node()
        assert s.count() == 100


def test_node_metrics_are_exposed_for_prometheus(tmp_path):
    import asyncio

    from rockstate.local.runners import ThreadRunner
    from rockstate.config import NodeConfig

    with local_cluster(nodes=1, partitions=4, root=str(tmp_path), processes=False) as cluster:
        runner: ThreadRunner = cluster._runner
        [info] = runner.start_nodes([NodeConfig(coordinator=cluster.address, data_dir=str(tmp_path / "m"), metrics_port=0)])
        node = runner.nodes[info.node_id]
        cluster.wait_balanced()
        with cluster.connect() as rs:
            rs.value_state("metered").put_many({i: i for i in range(100)})
            rs.value_state("metered").get_many(range(100))
        port = node.metrics._http.server_port
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert 'rockstate_node_request_seconds_count{op="write"} ' in text
        assert "rockstate_node_request_seconds_bucket" in text
        assert "rockstate_node_partitions 2.0" in text
        assert asyncio  # the node ran on the runner's loop


def test_cli_as_a_user_runs_it(tmp_path):
    exe = [sys.executable, "-m", "rockstate.cli"]
    port = _free_port()
    procs = []
    try:
        procs.append(subprocess.Popen([*exe, "coordinator", "--port", str(port), "--data-dir", str(tmp_path / "c"), "--partitions", "8"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for i in range(2):
            procs.append(subprocess.Popen([*exe, "node", "--coordinator", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / f"n{i}")],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

        def status():
            out = subprocess.run([*exe, "status", "--coordinator", f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=30)
            return out.stdout if out.returncode == 0 and out.stdout.count(" alive ") == 2 and " 4 " in out.stdout else None

        out = wait_until(status, 30, "two nodes in `rockstate status`", interval=0.2)
        assert "node-1" in out and "node-2" in out and "8 partitions" in out
        for cmd in (["coordinator", "--help"], ["node", "--help"], ["status", "--help"]):
            help_text = subprocess.run([*exe, *cmd], capture_output=True, text=True, timeout=30).stdout
            assert "usage: rockstate" in help_text
        bad = subprocess.run([*exe, "status", "--coordinator", "127.0.0.1:1"], capture_output=True, text=True, timeout=30)
        assert bad.returncode == 2 and "rockstate: error:" in bad.stderr
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_client_gives_up_with_a_clear_error_when_the_coordinator_is_gone():
    with pytest.raises(Exception) as info:
        ClusterBackend(f"127.0.0.1:{_free_port()}", timeout=1.0)
    assert "connect" in str(info.value)
    assert time  # noqa
