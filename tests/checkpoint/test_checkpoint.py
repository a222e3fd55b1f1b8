"""Embedded checkpoints end to end: real RocksDB, storage on file:// and on S3 (moto's server)."""

import os
import re
import threading

import pytest

import rockstate
from rockstate.checkpoint.restore import load_manifests, load_metadata
from rockstate.checkpoint.storage import checkpoint_dir, metadata_path
from rockstate.errors import (
    CheckpointAbortedError,
    CheckpointNotFoundError,
    CheckpointsNotConfiguredError,
    CorruptCheckpointError,
    PartitionCountError,
    SavepointExistsError,
)

from .conftest import wait_for


def contents(rs):
    """Every state's entries, as plain dicts."""
    out = {}
    for name, spec in rs.backend.store.specs.items():
        if spec.kind == "value":
            out[name] = dict(rs.value_state(name).items())
        elif spec.kind == "map":
            out[name] = {(k, uk): v for k, uk, v in rs.map_state(name).entries()}
        else:
            s = rs.list_state(name)
            out[name] = {k: s.get(k) for k in s.keys()}
    return out


def fill(rs, n=2000, tag="a"):
    rs.value_state("v").put_many({i: f"{tag}{i}" for i in range(n)})
    rs.map_state("m").put_all("user", {f"f{i}": i for i in range(50)})
    rs.list_state("l").extend("k", [tag, 1, 2])


def paths_of(storage, chk):
    """Every storage path checkpoint ``chk`` consists of: its folder's files and the shared files it references."""
    meta = load_metadata(storage, chk)
    manifests = load_manifests(storage, meta)
    files = {metadata_path(chk)} | {r.path for r in meta.manifests}
    return files | {f.path for m in manifests.values() for f in m.files}


def test_restore_returns_exactly_a_checkpoints_contents(url, open_store):
    rs = open_store(checkpoints=url)
    fill(rs)
    first = contents(rs)
    c1 = rs.checkpoint()
    assert (c1.id, c1.state) == (1, "COMPLETED") and c1.size > 0 and c1.bytes_uploaded == c1.size and c1.duration > 0
    rs.value_state("v").put_many({i: f"b{i}" for i in range(1000, 3000)})
    rs.value_state("v").delete(0)
    rs.map_state("m").put("user", "new", 1)
    rs.list_state("l").append("k", 3)
    rs.value_state("later").put("x", 1)  # a state defined after the first checkpoint
    second = contents(rs)
    c2 = rs.checkpoint()
    rs.value_state("v").put(5, "after")  # writes after the last checkpoint
    rs.value_state("v").delete(7)
    rs.list_state("l").clear("k")
    assert contents(rs) != second

    result = rs.restore()
    assert (result.checkpoint_id, result.skipped, result.source) == (c2.id, [], "checkpoint")
    assert contents(rs) == second  # the later writes are gone, the earlier ones there
    assert rs.restore(c1.id).checkpoint_id == c1.id
    assert {k: v for k, v in contents(rs).items() if k != "later"} == first and contents(rs)["later"] == {}
    assert rs.restore(c2.id).checkpoint_id == c2.id  # forward again
    assert contents(rs) == second
    rs.value_state("v").put(1, "writable after a restore")
    assert rs.value_state("v").get(1) == "writable after a restore"
    with pytest.raises(CheckpointNotFoundError):
        rs.restore(99)


def test_a_new_store_restores_the_latest_checkpoint_of_its_storage(url, open_store):
    rs = open_store("a", checkpoints=url)
    fill(rs)
    rs.checkpoint()
    rs.value_state("v").put(1, "second")
    c2 = rs.checkpoint()
    expected = contents(rs)
    rs.value_state("v").put(1, "not checkpointed")
    rs.close()

    fresh = open_store("b", checkpoints=url)  # an empty local store on the same storage
    assert fresh.restored.checkpoint_id == c2.id and fresh.restored.bytes_downloaded > 0
    assert contents(fresh) == expected
    assert [r.id for r in fresh.checkpoints()] == [1, 2]
    assert fresh.checkpoint().id == 3  # ids go on after the storage's
    fresh.close()

    again = open_store("a", checkpoints=url)  # a store with data of its own keeps it
    assert again.restored is None and again.value_state("v").get(1) == "not checkpointed"


def test_incremental_checkpoint_uploads_only_new_files(file_url, open_store, storage_of):
    rs = open_store(partitions=2, checkpoints=file_url)
    v = rs.value_state("v")
    v.put_many({i: os.urandom(200) for i in range(5000)})  # ~1 MB
    c1 = rs.checkpoint()
    assert c1.bytes_uploaded > 1_000_000
    changed = {i: os.urandom(200) for i in range(10)}
    v.put_many(changed)
    c2 = rs.checkpoint()
    # the ten new entries plus each partition's small private files (CURRENT, MANIFEST, OPTIONS, WAL)
    assert c2.bytes_uploaded < 50_000 and c2.size > c1.size
    storage = storage_of(file_url)
    m1 = load_manifests(storage, load_metadata(storage, c1.id))
    m2 = load_manifests(storage, load_metadata(storage, c2.id))
    for pid in (0, 1):
        old = {f.name: f for f in m1[pid].files if f.shared}
        for f in m2[pid].files:
            if f.name in old:  # an unchanged SST is referenced, never uploaded again
                assert (f.path, f.uploaded) == (old[f.name].path, False)
        assert any(f.shared and f.uploaded for f in m2[pid].files) == any(rs.partition_of(k) == pid for k in changed)
    c3 = rs.checkpoint()  # nothing changed: no SST is uploaded
    m3 = load_manifests(storage, load_metadata(storage, c3.id))
    assert not any(f.uploaded for m in m3.values() for f in m.files if f.shared)
    assert c3.bytes_uploaded < 40_000


def same_partition_keys(rs, pid, n):
    keys, i = [], 0
    while len(keys) < n:
        if rs.partition_of(("pair", i)) == pid:
            keys.append(("pair", i))
        i += 1
    return keys


def test_a_write_racing_a_checkpoint_is_never_half_in_it(file_url, open_store):
    rs = open_store(partitions=4, checkpoints=file_url, retained_checkpoints=20)
    v = rs.value_state("v")
    groups = [same_partition_keys(rs, pid, 40) for pid in (1, 2)]
    v.put_many({k: -1 for g in groups for k in g})
    written, stop, errors = [0], threading.Event(), []

    def writer():
        try:
            while not stop.is_set():
                n = written[0] + 1
                for g in groups:  # one atomic batch per group: all its keys get the same value
                    v.put_many({k: n for k in g})
                written[0] = n
                stop.wait(0.0002)  # pacing: lets the checkpoint thread have the GIL now and then
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    ids = []
    try:
        for _ in range(8):
            target = written[0] + 5
            wait_for(lambda: written[0] >= target or errors, what="writer progress")
            ids.append(rs.checkpoint().id)
    finally:
        stop.set()
        thread.join()
    assert not errors
    seen = []
    for chk in ids:
        rs.restore(chk)
        for g in groups:
            values = set(v.get_many(g))
            assert len(values) == 1, f"checkpoint {chk} holds half a batch: {sorted(values)}"
            seen.append(values.pop())
    # checkpoints advance with the writes, partition by partition (a checkpoint is a cut per partition: its
    # partitions are snapshotted at once, in no order, so one may hold a later batch of another's than the other)
    assert all(seen[g::2] == sorted(seen[g::2]) for g in range(2)) and len(set(seen)) > 2


def damage(storage, rel, kind):
    if kind == "corrupt":
        data = bytearray(storage.read_bytes(rel))
        data[len(data) // 2] ^= 0xFF
        storage.write_bytes(rel, bytes(data))
    elif kind == "truncated":
        storage.write_bytes(rel, storage.read_bytes(rel)[:-7])
    else:
        storage.delete([rel])


def two_checkpoints(rs):
    fill(rs)
    c1 = rs.checkpoint()
    first = contents(rs)
    rs.value_state("v").put_many({i: "changed" for i in range(0, 2000, 3)})
    c2 = rs.checkpoint()
    return c1, first, c2


@pytest.mark.parametrize(
    "kind, what",
    [("corrupt", "sst"), ("truncated", "sst"), ("missing", "sst"), ("corrupt", "manifest"), ("missing", "private"), ("truncated", "metadata")],
)
def test_a_damaged_checkpoint_falls_back_to_the_previous_one(kind, what, file_url, open_store, storage_of, caplog):
    rs = open_store("a", checkpoints=file_url)
    c1, first, c2 = two_checkpoints(rs)
    storage = storage_of(file_url)
    m2 = load_manifests(storage, load_metadata(storage, c2.id))
    rel = {
        "sst": next(f.path for f in m2[0].files if f.shared and f.uploaded),
        "manifest": load_metadata(storage, c2.id).manifest_ref(1).path,  # the store's bundle of manifests
        "private": next(f.path for f in m2[2].files if f.name.startswith("MANIFEST-")),
        "metadata": metadata_path(c2.id),
    }[what]
    damage(storage, rel, kind)

    fresh = open_store("b", checkpoints=file_url)
    assert fresh.restored.checkpoint_id == c1.id
    [skip] = fresh.restored.skipped
    assert skip.checkpoint_id == c2.id and fresh.restored.fell_back
    if what != "metadata":
        assert rel in skip.reason
    assert contents(fresh) == first
    assert f"checkpoint {c2.id} cannot be restored" in caplog.text


def test_fallback_on_s3_and_without_local_snapshots(s3_url, open_store, storage_of):
    rs = open_store(checkpoints=rockstate.config.CheckpointConfig(url=s3_url, local_snapshots=0))
    c1, first, c2 = two_checkpoints(rs)
    storage = storage_of(s3_url)
    m2 = load_manifests(storage, load_metadata(storage, c2.id))
    damage(storage, next(f.path for f in m2[3].files if f.shared and f.uploaded), "corrupt")
    result = rs.restore()  # asks for the latest: gets the one before, and says so
    assert result.checkpoint_id == c1.id and [s.checkpoint_id for s in result.skipped] == [c2.id]
    assert result.bytes_local == 0 and result.bytes_downloaded > 0
    assert contents(rs) == first
    with pytest.raises(CorruptCheckpointError):
        rs.backend.checkpointer.restore(c2.id, fallback=False)
    assert contents(rs) == first  # a failed restore leaves the store as it was


def test_a_checkpoint_without_metadata_is_never_used(file_url, open_store, storage_of):
    rs = open_store("a", checkpoints=file_url)
    c1, first, c2 = two_checkpoints(rs)
    storage = storage_of(file_url)
    storage.delete([metadata_path(c2.id)])  # as if the process died just before the commit
    rs.close()
    fresh = open_store("b", checkpoints=file_url)
    assert fresh.restored.checkpoint_id == c1.id and fresh.restored.skipped == []
    assert contents(fresh) == first
    assert [r.id for r in fresh.checkpoints()] == [c1.id]
    c3 = fresh.checkpoint()
    assert c3.id == c2.id + 1  # the half-written id is not reused
    assert storage.checkpoint_ids() == [c1.id, c3.id]  # and its leftovers are swept


def test_a_failed_commit_aborts_and_removes_the_partial_files(file_url, open_store, storage_of, monkeypatch):
    rs = open_store(checkpoints=file_url)
    fill(rs)
    c1 = rs.checkpoint()
    storage = storage_of(file_url)
    before = set(storage.list())
    rs.value_state("v").put_many({i: "x" * 100 for i in range(3000)})
    checkpointer = rs.backend.checkpointer
    real = checkpointer.storage.write_bytes

    def failing(rel, data):
        if rel.endswith("_metadata"):
            raise OSError("disk full")
        return real(rel, data)

    monkeypatch.setattr(checkpointer.storage, "write_bytes", failing)
    with pytest.raises(CheckpointAbortedError, match="disk full") as info:
        rs.checkpoint()
    assert info.value.data["checkpoint_id"] == c1.id + 1
    assert set(storage.list()) == before  # nothing of the aborted checkpoint is left
    monkeypatch.setattr(checkpointer.storage, "write_bytes", real)
    c3 = rs.checkpoint()
    history = {r.id: (r.state, r.failure) for r in rs.checkpoints()}
    assert history[c1.id + 1][0] == "ABORTED" and "disk full" in history[c1.id + 1][1]
    assert history[c3.id] == ("COMPLETED", None)
    rs.restore(c3.id)
    assert rs.value_state("v").get(2999) == "x" * 100


def test_a_checkpoint_past_its_timeout_is_aborted(file_url, open_store, storage_of):
    rs = open_store(checkpoints=rockstate.config.CheckpointConfig(url=file_url, timeout=0.5))
    fill(rs)
    checkpointer = rs.backend.checkpointer
    real, release, lock, active, stuck = checkpointer.storage.upload, threading.Event(), threading.Lock(), [0], []

    def slow_upload(local, rel):
        if not rel.startswith("shared/") or release.is_set():
            return real(local, rel)
        with lock:
            active[0] += 1
            stuck.append(rel)
        try:
            release.wait(10)
            return real(local, rel)
        finally:
            with lock:
                active[0] -= 1

    checkpointer.storage.upload = slow_upload
    try:
        with pytest.raises(CheckpointAbortedError, match="timed out after 0.5 s"):
            rs.checkpoint()
    finally:
        release.set()
    storage = storage_of(file_url)
    assert stuck and not storage.exists(metadata_path(1))
    record = rs.checkpoints()[0]
    assert record.state == "ABORTED" and re.search(r"0 of 4 partitions acked", record.failure)
    wait_for(lambda: active[0] == 0, what="the stuck uploads to land")  # after the abort: orphans
    c2 = rs.checkpoint()
    assert c2.id == 2
    assert set(storage.list()) == paths_of(storage, 2)  # the orphans are swept
    rs.restore()
    assert contents(rs)["v"] == {i: f"a{i}" for i in range(2000)}


def test_garbage_collection_keeps_exactly_the_retained_checkpoints_files(url, open_store, storage_of):
    rs = open_store(checkpoints=url, retained_checkpoints=2)
    storage = storage_of(url)
    v = rs.value_state("v")
    storage.write_bytes("shared/p0001/orphan-from-a-dead-upload.sst", b"junk")
    deleted_shared = set()
    for round_ in range(5):
        v.put_many({i: f"r{round_}-{i}" for i in range(round_ * 300, round_ * 300 + 1500)})
        if round_ == 2:
            for pid in rs.backend.store.owned():  # merge SSTs: older files leave the live set
                rs.backend.store.partition(pid).db.get_column_family("v").compact_range(None, None)
        before = {p for p in storage.list() if p.startswith("shared/")}
        rs.checkpoint()
        deleted_shared |= before - set(storage.list())
        retained = storage.completed_ids()
        assert retained == list(range(1, round_ + 2))[-2:]
        expected = set().union(*(paths_of(storage, c) for c in retained))
        assert set(storage.list()) == expected, f"after checkpoint {round_ + 1}"
    assert storage.completed_ids() == [4, 5]
    assert "shared/p0001/orphan-from-a-dead-upload.sst" in deleted_shared
    assert len(deleted_shared) > 1  # files only dropped checkpoints used are gone
    assert [r.retained for r in rs.checkpoints()] == [False, False, False, True, True]
    rs.restore(4)  # the retained ones still restore
    assert v.get(4 * 300 - 1) == "r3-1199"


def test_a_savepoint_is_self_contained(url, open_store, storage_of):
    rs = open_store("a", checkpoints=url)
    fill(rs)
    rs.checkpoint()
    sp = rs.savepoint("before-upgrade")
    expected = contents(rs)
    assert sp.checkpoint_id == 2 and sp.size > 0 and sp.files > 0
    with pytest.raises(SavepointExistsError):
        rs.savepoint("before-upgrade")
    assert [s.name for s in rs.savepoints()] == ["before-upgrade"]
    rs.value_state("v").put_many({i: "later" for i in range(100)})
    rs.checkpoint()
    storage = storage_of(url)
    for chk in storage.checkpoint_ids():  # every checkpoint and every shared file gone
        storage.delete_tree(checkpoint_dir(chk))
    storage.delete_tree("shared")
    assert all(p.startswith("savepoints/before-upgrade/") for p in storage.list())

    result = rs.restore(savepoint="before-upgrade")
    assert (result.checkpoint_id, result.source) == (2, "savepoint before-upgrade")
    assert contents(rs) == expected
    c = rs.checkpoint()  # checkpoints after a savepoint never depend on its files
    manifests = load_manifests(storage, load_metadata(storage, c.id))
    assert all(f.uploaded and not f.path.startswith("savepoints/") for m in manifests.values() for f in m.files)
    rs.close()

    started = open_store("b", checkpoints=url, restore_from="before-upgrade")
    assert started.restored.source == "savepoint before-upgrade" and contents(started) == expected
    with pytest.raises(CheckpointNotFoundError):
        started.restore(savepoint="no-such-savepoint")


def test_restore_prefers_local_snapshots_and_checks_them(file_url, open_store):
    rs = open_store(checkpoints=file_url)
    fill(rs)
    c1 = rs.checkpoint()
    expected = contents(rs)
    rs.value_state("v").put_many({i: "later" for i in range(500)})
    result = rs.restore()
    assert result.bytes_downloaded == 0 and result.bytes_local > 0  # hard links, no download
    assert contents(rs) == expected

    local = rs.backend.checkpointer.snapshotter.local_snapshots()[c1.id]
    name = next(n for n in os.listdir(local) if n.endswith(".sst"))
    size = os.path.getsize(os.path.join(local, name))
    os.unlink(os.path.join(local, name))  # a damaged local copy (a new inode: the live file is untouched)
    with open(os.path.join(local, name), "wb") as f:
        f.write(b"\0" * size)
    result = rs.restore()
    assert result.partitions[0].files_downloaded == 1 and contents(rs) == expected


def test_periodic_checkpoints(file_url, open_store):
    rs = open_store(checkpoints=file_url, checkpoint_interval=0.1)
    rs.value_state("v").put(1, 1)
    wait_for(lambda: len([r for r in rs.checkpoints() if r.state == "COMPLETED"]) >= 3, what="three periodic checkpoints")
    assert {r.trigger for r in rs.checkpoints()} == {"periodic"}
    assert rs.checkpoint().trigger == "manual"  # a manual one waits for the periodic one in flight


def test_start_from_a_checkpoint_id_and_refuse_another_partition_count(file_url, open_store):
    rs = open_store("a", checkpoints=file_url)
    rs.value_state("v").put(1, "one")
    c1 = rs.checkpoint()
    rs.value_state("v").put(1, "two")
    rs.checkpoint()
    rs.value_state("v").put(1, "three")
    rs.close()
    again = open_store("a", checkpoints=file_url, restore_from=c1.id)
    assert again.restored.checkpoint_id == c1.id and again.value_state("v").get(1) == "one"
    with pytest.raises(PartitionCountError):
        open_store("c", partitions=8, checkpoints=file_url)


def test_checkpoint_calls_without_storage_say_how_to_configure_it(open_store):
    rs = open_store()
    with pytest.raises(CheckpointsNotConfiguredError, match="checkpoints=URL"):
        rs.checkpoint()
    assert rs.restored is None
    with pytest.raises(CheckpointsNotConfiguredError):
        open_store("b", restore_from=1)
