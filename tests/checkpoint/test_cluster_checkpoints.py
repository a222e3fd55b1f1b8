"""Checkpoints of a real multi-process cluster: barrier snapshots, restore, savepoints, failover, start from storage."""

import pytest

from rockstate.local.cluster import wait_until
from rockstate.errors import CheckpointsNotConfiguredError, PartitionUnavailableError, RockstateError
from rockstate.testing.faults import FaultPlan

from .conftest import wait_for
from rockstate.testing.cluster import gen_cluster, local_cluster


def test_checkpoint_and_restore_of_the_whole_cluster(tmp_path, url):
    with local_cluster(processes=True, nodes=3, partitions=9, root=str(tmp_path / "c"), checkpoints=url) as cluster:
        with cluster.connect() as rs:
            s = rs.value_state("orders")
            s.put_many({i: f"v{i}" for i in range(3000)})
            first = rs.checkpoint()
            assert first.id >= 1 and first.duration > 0 and first.bytes_uploaded > 0
            s.put_many({i: "later" for i in range(1000)})
            s.put_many({i: "new" for i in range(3000, 3500)})
            second = rs.checkpoint()
            assert second.id > first.id
            assert [c.id for c in rs.checkpoints() if c.state == "COMPLETED"][-2:] == [first.id, second.id]
            s.put(0, "after both")
            result = rs.restore(first.id)
            assert result.checkpoint_id == first.id and not result.skipped
            assert s.get_many(range(3500)) == [f"v{i}" for i in range(3000)] + [None] * 500
            result = rs.restore()  # the latest
            assert result.checkpoint_id == second.id
            assert s.get_many([0, 999, 1000, 3499]) == ["later", "later", "v1000", "new"]
            status = cluster.status()
            assert status["checkpoints"]["latest"] == second.id


def test_savepoint_and_a_new_cluster_starting_from_the_storage(tmp_path, file_url):
    with local_cluster(processes=True, nodes=2, partitions=6, root=str(tmp_path / "a"), checkpoints=file_url) as cluster:
        with cluster.connect() as rs:
            rs.value_state("kept").put_many({i: i for i in range(500)})
            rs.map_state("m").put("k", "u", [1, 2])
            info = rs.savepoint("before-upgrade")
            assert info.name == "before-upgrade" and info.files > 0
            assert [sp.name for sp in rs.savepoints()] == ["before-upgrade"]
            rs.value_state("kept").put_many({i: -1 for i in range(500)})
            rs.checkpoint()
            rs.restore(savepoint="before-upgrade")
            assert rs.value_state("kept").get_many(range(500)) == list(range(500))
            rs.value_state("kept").put(1, "latest")
            rs.checkpoint()
    # same storage, a brand-new cluster: it starts from the latest checkpoint
    with local_cluster(processes=True, nodes=2, partitions=6, root=str(tmp_path / "b"), checkpoints=file_url) as cluster:
        with cluster.connect() as rs:
            wait_for(lambda: any(e["event"] == "cluster_restored" for e in cluster.status()["events"]), 30, what="restore on start")
            assert rs.value_state("kept").get(1) == "latest" and rs.value_state("kept").get(2) == 2
            assert rs.map_state("m").get("k", "u") == [1, 2]


def test_killed_node_is_restored_from_the_latest_checkpoint(tmp_path, file_url):
    with local_cluster(processes=True, nodes=3, partitions=9, root=str(tmp_path), checkpoints=file_url, heartbeat_timeout=1.0, backup_count=0) as cluster:
        with cluster.connect(retry_timeout=30) as rs:
            s = rs.value_state("durable")
            s.put_many({i: "checkpointed" for i in range(900)})
            chk = rs.checkpoint().id
            s.put_many({i: "after" for i in range(900)})  # lost on the dead node's partitions
            victim = cluster.nodes()[0]
            owned = set(rs.backend.refresh().owned_by(victim.node_id))
            cluster.kill_node(victim.node_id)
            restored = wait_until(
                lambda: [e for e in cluster.status()["events"] if e["event"] == "partition_restored"], 30, "failover")
            assert {e["partition"] for e in restored} == owned and {e["checkpoint"] for e in restored} == {chk}
            table = rs.backend.refresh()
            assert victim.node_id not in table.owners
            values = s.get_many(range(900))
            for i, value in enumerate(values):
                lost = rs.partition_of(i) in owned
                assert value == ("checkpointed" if lost else "after"), (i, value, lost)
            s.put(0, "writable again")
            assert s.get(0) == "writable again"


@gen_cluster(nodes=3, partitions=6, checkpoints="faulty::file://{tmp_path}/chk", heartbeat_timeout=1.0, backup_count=0)
def test_failover_waits_out_a_failing_storage_and_never_serves_an_older_state(cluster):
    """The storage fails every read while a dead node's partitions are restored: they stay unavailable, the
    restore is retried, and once the storage works they come back with exactly the checkpoint's contents."""
    fs = cluster._runner.coordinators[0].checkpoints.storage.fs  # one instance, shared by the in-process nodes
    fs.plan = FaultPlan()
    with cluster.connect(retry_timeout=1) as rs:
        s = rs.value_state("durable")
        s.put_many({i: "checkpointed" for i in range(300)})
        chk = rs.checkpoint().id
        s.put_many({i: "after" for i in range(300)})
        victim = cluster.nodes()[0].node_id
        owned = set(rs.backend.refresh().owned_by(victim))
        on_victim = [i for i in range(300) if rs.partition_of(i) in owned]
        fs.plan = FaultPlan(error_rate=1.0)
        cluster.kill_node(victim)
        wait_until(lambda: [e for e in rs.backend.events() if e["event"] == "failover_retry"], 30, "a failed restore")
        with pytest.raises(RockstateError) as unavailable:
            s.get(on_victim[0])
        assert unavailable.value.retryable
        for _ in range(2):  # a checkpoint refused for a partition without an owner leaves none in flight
            with pytest.raises(PartitionUnavailableError):
                rs.checkpoint()
        fs.plan = FaultPlan()
        wait_until(lambda: [e for e in rs.backend.events() if e["event"] == "partition_restored"], 30, "the failover")
        assert rs.checkpoint().id > chk
        values = s.get_many(range(300))
        assert values == ["checkpointed" if i in on_victim else "after" for i in range(300)]
        assert {e["checkpoint"] for e in rs.backend.events() if e["event"] == "partition_restored"} == {chk}


@gen_cluster(nodes=1, partitions=2, processes=True)
def test_events_survive_a_coordinator_restart_and_keep_their_order(cluster):
    before = cluster.status()["events"]
    assert before and before[-1]["seq"] == len(before)
    cluster.kill_coordinator()
    cluster.restart_coordinator()
    with cluster.connect(retry_timeout=30) as rs:
        after = wait_until(lambda: [e for e in rs.backend.events() if e["event"] == "coordinator_resumed"], 30, "resume")
        events = rs.backend.events()
    assert events[:len(before)] == before, "what happened before the kill is still there"
    assert after[0]["seq"] > before[-1]["seq"]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))


@gen_cluster(nodes=1, partitions=2)
def test_a_cluster_without_storage_says_so(cluster):
    with cluster.connect() as rs:
        with pytest.raises(CheckpointsNotConfiguredError, match="--checkpoints"):
            rs.checkpoint()


def test_checkpoint_and_savepoint_commands(tmp_path, file_url):
    import subprocess
    import sys

    def run(*args):
        return subprocess.run([sys.executable, "-m", "rockstate.cli", *args, "--coordinator", cluster.address],
                              capture_output=True, text=True, timeout=120)

    def cli(*args):
        out = run(*args)
        assert out.returncode == 0, out.stderr
        return out.stdout

    with local_cluster(processes=True, nodes=2, partitions=4, root=str(tmp_path), checkpoints=file_url) as cluster:
        with cluster.connect() as rs:
            rs.value_state("v").put_many({i: i for i in range(100)})
        assert "completed" in cli("checkpoint", "trigger")
        listed = cli("checkpoint", "list")
        assert "COMPLETED" in listed and "manual" in listed
        assert "4 partitions, states ['v']" in cli("checkpoint", "inspect", "1")
        assert "savepoint nightly of checkpoint" in cli("savepoint", "create", "nightly")
        assert "nightly" in cli("savepoint", "list")
        assert "restored savepoint nightly" in cli("savepoint", "restore", "nightly", "--yes")
        assert "restored checkpoint" in cli("checkpoint", "restore", "--yes")
        # a restore leaves backups to copy again: degraded (exit 1) until they are in sync, then healthy
        healthy = wait_until(lambda: (out := run("status")).returncode == 0 and out, 60, "healthy after the restore")
        assert "latest completed" in healthy.stdout


def test_restored_names_the_restore_just_done_on_a_cluster(tmp_path, file_url):
    with local_cluster(nodes=2, partitions=4, root=str(tmp_path), checkpoints=file_url, processes=False) as cluster:
        with cluster.connect() as rs:
            assert rs.restored is None
            orders = rs.value_state("orders")
            orders.put_many({f"order-{i:04d}-7f3a": {"total": f"{i}.50", "at": "2026-11-23T12:00:00Z"} for i in range(200)})
            first = rs.checkpoint()
            orders.put("order-0001-7f3a", {"total": "0.00", "at": "2026-11-23T12:05:00Z"})
            result = rs.restore(first.id)
            assert rs.restored is rs.backend.checkpointer.last_restore
            assert rs.restored.checkpoint_id == first.id and rs.restored.source == "checkpoint"
            assert sorted(p.partition for p in rs.restored.partitions) == [0, 1, 2, 3] and result.seconds > 0
            assert orders.get("order-0001-7f3a")["total"] == "1.50"
