"""New backups' copies (issue 33): a new cluster's backups of never-written partitions are empty copies (no files
sent), a written partition's backup gets its files, and the copies hold the data: after the primaries' node is
killed, every key reads back from the promoted backups."""

from __future__ import annotations

import datetime
import time

import pytest

from rockstate.cluster import protocol as p
from rockstate.cluster.replication.copies import OPENING
from rockstate.errors import PartitionUnavailableError, ProtocolError
from rockstate.local.cluster import wait_until
from rockstate.rpc.client import Channel
from rockstate.testing.cluster import gen_cluster
from rockstate.testing.workload import keys_for

PARTITIONS = 12


def copies(cluster, after: int = 0) -> list[dict]:
    return [e for e in cluster.status()["events"] if e["event"] == "replica_copied" and e["seq"] > after]


@pytest.mark.timeout(300)
@gen_cluster(nodes=2, partitions=PARTITIONS, processes=True, backup_count=1, heartbeat_timeout=6.0)
def test_backups_of_never_written_partitions_are_empty_copies_and_written_ones_carry_their_data(cluster):
    cluster.wait_replicated(120)
    first = copies(cluster)
    assert len(first) == PARTITIONS and all(e["bytes"] == 0 for e in first), first  # nothing written: no files sent
    last = max(e["seq"] for e in cluster.status()["events"])
    with cluster.connect(retry_timeout=60) as rs:
        state = rs.value_state("copied")
        keys = keys_for(rs, per_partition=20)
        state.put_many({k: f"value-{k}" for k in keys})
        rs.backend.refresh()
        cluster.add_node()  # backups and primaries move to it: written partitions copied with their files
        cluster.wait_replicated(120)
        moved = copies(cluster, last)
        assert moved and all(e["bytes"] > 0 for e in moved), moved
        # every partition whose primary is on the first node loses it: its backup, copied or not, is promoted
        victim = cluster.nodes()[0].node_id
        lost = rs.backend.refresh().owned_by(victim)
        assert lost
        cluster.kill_node(victim)
        wait_until(lambda: not set(rs.backend.refresh().owned_by(victim)), 60, "the victim's partitions promoted")
        assert state.get_many(keys) == [f"value-{k}" for k in keys]


@gen_cluster(nodes=2, partitions=PARTITIONS, backup_count=1, heartbeat_timeout=4.0)
def test_copies_too_large_for_a_message_go_in_files_and_their_data_survives_a_promotion(cluster, monkeypatch):
    """With the message's limit at 0 bytes every written partition's copy goes as an export (the nodes run in this
    process: the limit is lowered here), as a large one does; a join copies them, and after the first node's abrupt
    stop its partitions' promoted backups hold every key."""
    monkeypatch.setattr("rockstate.cluster.replication.copies.INLINE_BYTES", 0)
    cluster.wait_replicated(60)
    last = max(e["seq"] for e in cluster.status()["events"])
    with cluster.connect(retry_timeout=60) as rs:
        state = rs.value_state("files")
        keys = keys_for(rs, per_partition=20)
        values = {k: (k, datetime.datetime(2026, 11, 28, 13, i % 60)) for i, k in enumerate(keys)}
        state.put_many(values)
        cluster.add_node()
        cluster.wait_replicated(120)
        moved = copies(cluster, last)
        assert moved and all(e["bytes"] > 0 for e in moved), moved  # written partitions: files
        victim = cluster.nodes()[0].node_id
        assert rs.backend.refresh().owned_by(victim)
        cluster.kill_node(victim)
        wait_until(lambda: not set(rs.backend.refresh().owned_by(victim)), 60, "the victim's partitions promoted")
        assert [tuple(v) for v in state.get_many(keys)] == [values[k] for k in keys]


@gen_cluster(nodes=2, partitions=PARTITIONS, backup_count=1)
def test_a_copy_asked_of_a_node_that_handed_the_partition_on_is_refused_at_once(cluster):
    # In a join, a backup's copy request can reach a primary that has just handed one of its partitions on. It
    # waited OPENING (10 s) for it to come back, then the next request waited again: joins of 35-45 s at P=271.
    cluster.wait_replicated(60)
    with cluster.connect() as rs:
        table = rs.backend.refresh()
        pid = 0
        primary = table.owners[pid]
        other = next(n for n in table.addresses if n != primary)
        channel = Channel(table.addresses[other])  # a node that is not pid's primary, at pid's replica epoch
        try:
            start = time.monotonic()
            with pytest.raises(PartitionUnavailableError):
                channel.call(p.ReplicaCopy(partitions=[pid], node=primary, epochs=[table.replica_epoch(pid)]))
            assert time.monotonic() - start < OPENING / 2
            with pytest.raises(ProtocolError, match="epochs"):  # refused, and the node goes on serving
                channel.call(p.ReplicaCopy(partitions=[pid], node=primary, epochs=[1, 2]))
        finally:
            channel.close()
        rs.value_state("after").put("k", "v")
        assert rs.value_state("after").get("k") == "v"


@gen_cluster(nodes=2, partitions=PARTITIONS, backup_count=1)
def test_small_partitions_copies_come_in_the_answer_and_larger_ones_are_left_for_files(cluster, monkeypatch):
    """A backup asks for the small partitions' copies as entries first (``ReplicaInline``): the primary answers each
    it serves whose keys and values weigh at most INLINE_BYTES, as a cut of its writes (its data, request ids and
    batch number), a never-written one as nothing, leaves the others for files, and refuses what it does not serve.
    (The nodes run in this process: the limit is lowered here.)"""
    cluster.wait_replicated(60)
    with cluster.connect() as rs:
        table = rs.backend.refresh()
        primary = table.owners[0]
        mine = [pid for pid in range(PARTITIONS) if table.owners[pid] == primary]
        written = mine[: len(mine) // 2]
        keys = [k for k in keys_for(rs, per_partition=3) if rs.partition_of(k) in written]
        values = {k: (datetime.datetime(2026, 11, 28, 12, i % 60), k) for i, k in enumerate(keys)}  # timestamps, strings
        rs.value_state("inline").put_many(values)
        backup = table.backups_of(mine[0])[0]
        epochs = [table.replica_epoch(pid) for pid in mine]
        channel = Channel(table.addresses[primary])
        try:
            copies = dict(channel.call(p.ReplicaInline(partitions=mine, node=backup, epochs=epochs)))
            assert sorted(copies) == sorted(mine)
            assert all(copies[pid] == {} for pid in mine if pid not in written)  # never written: nothing
            for pid in written:
                assert len(copies[pid]["inline"][0]) == 3 and len(copies[pid]["_requests"][0]) == 1  # a put_many's id
                assert copies[pid]["_replication"][0] == [b"seq"]  # its batch number comes with it
            monkeypatch.setattr("rockstate.cluster.replication.copies.INLINE_BYTES", 1)
            small = dict(channel.call(p.ReplicaInline(partitions=mine, node=backup, epochs=epochs)))
            assert sorted(small) == sorted(set(mine) - set(written))  # the written ones go in files
            other = next(pid for pid in range(PARTITIONS) if table.owners[pid] != primary)
            with pytest.raises(PartitionUnavailableError):
                channel.call(p.ReplicaInline(partitions=[other], node=backup, epochs=[table.replica_epoch(other)]))
            with pytest.raises(ProtocolError, match="epochs"):
                channel.call(p.ReplicaInline(partitions=mine, node=backup, epochs=[1]))
        finally:
            channel.close()
        assert [tuple(v) for v in rs.value_state("inline").get_many(keys)] == [values[k] for k in keys]  # served on


@gen_cluster(nodes=2, partitions=PARTITIONS, backup_count=1)
def test_a_backup_of_an_earlier_version_asking_a_copy_per_partition_gets_an_export_of_each(cluster):
    """A backup asks its copies as one export (``ReplicaCopyGroup``); one of an earlier version asks a
    ``ReplicaCopy`` and must still get an export per partition, which it takes as before (never a group it would
    read as empty copies)."""
    import asyncio
    import shutil
    import tempfile

    from rockstate.cluster.transfer import receive_files
    from rockstate.config import StoreConfig
    from rockstate.rpc.async_client import AsyncChannel
    from rockstate.store import Store

    cluster.wait_replicated(60)
    with cluster.connect() as rs:
        keys = keys_for(rs, per_partition=20)
        rs.value_state("copied").put_many({k: "v" for k in keys})
        table = rs.backend.refresh()
    pids = [pid for pid in range(PARTITIONS) if table.owners[pid] == table.owners[0]][:2]
    backup = table.backups_of(pids[0])[0]
    root = tempfile.mkdtemp()

    async def ask(msg):
        channel = AsyncChannel(table.addresses[table.owners[0]])
        try:
            def consume(answer, read_into):
                for pid, files in answer["parts"]:
                    receive_files(files, f"{root}/{type(msg).__name__}-{pid}", read_into)
                if "files" in answer:
                    receive_files(answer["files"], f"{root}/{type(msg).__name__}", read_into)
                return answer
            return await channel.stream(msg, consume)
        finally:
            await channel.close()

    try:
        fields = {"partitions": pids, "node": backup, "epochs": [table.replica_epoch(pid) for pid in pids]}
        old = asyncio.run(ask(p.ReplicaCopy(**fields)))
        assert "files" not in old and all({"0000.sst", "states.json"} <= {f for f, _ in files} for _, files in old["parts"])
        group = asyncio.run(ask(p.ReplicaCopyGroup(**fields)))
        assert [files for _, files in group["parts"]] == [[], []] and {"0000.sst", "states.json"} <= {f for f, _ in group["files"]}
        for copies in ({pid: (f"{root}/ReplicaCopy-{pid}", pid) for pid in pids},
                       {pid: (f"{root}/ReplicaCopyGroup", pid) for pid in pids}):
            store = Store(f"{root}/store", StoreConfig(partitions=PARTITIONS), owned=[])
            try:
                store.replace_partitions(copies, {"copied": {"name": "copied", "kind": "value"}})
                assert [len(store.scan(pid, "copied", limit=100)) for pid in pids] == [20, 20]
            finally:
                store.close()
                shutil.rmtree(f"{root}/store")
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("entries", [
    "not a dict",
    {"../up": [[b"k"], [b"v"]]},  # a state name that is a path
    {"inline": [[b"k", b"k2"], [b"v"]]},  # lengths that differ
    {"inline": [[b"k"], ["v"]]},  # a value that is not bytes
    {"inline": [[b"k"], [b"v"]], "_requests": [[7], [b"w"]]},  # a key that is not bytes, after a good state
])
def test_a_copys_entries_from_another_node_are_checked_whole_before_anything_is_written(tmp_path, entries):
    from rockstate.config import StoreConfig
    from rockstate.errors import RockstateError
    from rockstate.store import StateSpec, Store

    store = Store(str(tmp_path / "s"), StoreConfig(partitions=PARTITIONS), owned=[], reserved=("_requests", "_replication"))
    try:
        store.define_state(StateSpec("inline", "value"))
        with pytest.raises(RockstateError):
            store.db.put_entries(3, entries)
        assert store.db.empty(3)
        assert store.db.put_entries(3, {"inline": [[b"k"], [b"v"]]}) == 2  # and a good one goes in
        assert store.open_partition(3).get_many("inline", [b"k"]) == [b"v"]
    finally:
        store.close()
