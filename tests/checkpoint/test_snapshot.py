"""The node-side pieces on their own: snapshot a store's partitions, restore one elsewhere (as a node would)."""

import os

import msgpack
import pytest

from rockstate.checkpoint import snapshot
from rockstate.checkpoint.manifest import FileEntry, KeyGroup, PartitionManifest, from_group, group_bytes, group_dict
from rockstate.checkpoint.restore import restore_partition
from rockstate.checkpoint.snapshot import Snapshotter, UploadTracker
from rockstate.checkpoint.storage import group_path
from rockstate.config import StoreConfig
from rockstate.errors import CorruptCheckpointError
from rockstate.store import PUT, StateSpec, Store


@pytest.fixture
def node_store(tmp_path):
    store = Store(str(tmp_path / "node-a"), StoreConfig(partitions=8), owned=[3, 5])
    store.define_state(StateSpec("s", "value"))
    yield store
    store.close()


def put(store, pid, n, tag):
    store.write(pid, [(PUT, "s", f"k{i}".encode(), f"{tag}{i}".encode() * 10) for i in range(n)])


def snapshotter(storage, tmp_path, **kw):
    return Snapshotter(storage, str(tmp_path / "node-a" / "checkpoints"), owner="sa", **kw)


def test_one_snapshot_of_the_store_gives_each_partition_its_key_group_and_restores_elsewhere(node_store, storage_of, file_url, tmp_path):
    storage = storage_of(file_url)
    snap = snapshotter(storage, tmp_path, keep_local=1)
    put(node_store, 3, 1000, "a")
    put(node_store, 5, 10, "x")
    local = snap.sync_phase(node_store.db, 1)
    assert local.pause_seconds < 1.0 and os.path.exists(os.path.join(local.path, "CURRENT")) and "s" in local.states
    put(node_store, 3, 1000, "b")  # after the barrier: not in checkpoint 1
    m3, m5 = snap.async_phase(local, [3, 5])
    assert (m3.key_group, m5.key_group) == (KeyGroup("sa", 3, 2), KeyGroup("sa", 5, 2))
    assert m3.files == m5.files and all(f.path.startswith(("shared/sa/", "chk-000001/sa/")) for f in m3.files)
    ack = msgpack.unpackb(msgpack.packb(group_dict([m5, m3])))  # what the node sends the coordinator: one group
    assert from_group(ack) == [m3, m5]
    stored = storage.read_bytes(group_path(1, "sa"))  # one file for the store's partitions: the files listed once
    assert stored == group_bytes([m3, m5]) == group_bytes([m5, m3]) and stored.count(b'"checksum"') == len(m3.files)
    assert m3.uploaded_bytes == m3.size == sum(f.size for f in m3.files) // 2  # each counts its share

    other = Store(str(tmp_path / "node-b"), StoreConfig(partitions=8), owned=[])  # a node that does not own p3 yet
    copy = str(tmp_path / "fetched")
    stats = restore_partition(storage, m3, copy)
    assert stats.files_downloaded == len(m3.files)
    other.replace_partitions({3: (copy, 3)}, {"s": {"name": "s", "kind": "value"}})
    part = other.partition(3)
    assert part.get_many("s", [b"k1", b"k999"]) == [b"a1" * 10, b"a999" * 10]
    assert other.scan(3, "s", b"k1", limit=3) == [(b"k1", b"a1" * 10), (b"k10", b"a10" * 10), (b"k100", b"a100" * 10)]
    assert other.db.empty(5)  # the other partition's keys in the same files: not taken
    other.close()

    # the next snapshot references the confirmed files and uploads only what is new
    snap.confirm(1)
    [m] = snap.snapshot(node_store.db, 2, [3])
    assert m.uploaded_bytes < m.size
    assert not os.path.exists(snap.local_path(1)) and os.path.exists(snap.local_path(2))  # keep_local=1


def test_unconfirmed_or_dropped_checkpoints_are_never_referenced(node_store, storage_of, file_url, tmp_path):
    storage = storage_of(file_url)
    snap = snapshotter(storage, tmp_path)
    put(node_store, 5, 500, "a")
    [m1] = snap.snapshot(node_store.db, 1, [5])
    [m2] = snap.snapshot(node_store.db, 2, [5])  # 1 was never confirmed: its files may be deleted
    assert m2.uploaded_bytes == m2.size
    [m3] = snap.snapshot(node_store.db, 3, [5], retained=(2,))  # the barrier says 2 completed: confirmed now
    assert {f.path for f in m3.files if f.shared} == {f.path for f in m2.files if f.shared}
    assert not any(f.uploaded for f in m3.files if f.shared)
    [m4] = snap.snapshot(node_store.db, 4, [5], retained=(7,))  # 2 and 3 are no longer retained
    assert all(f.uploaded for f in m4.files)
    assert m1.checkpoint_id == 1

    # the upload record survives a restart of the process
    snap.confirm(4)
    again = snapshotter(storage, tmp_path)
    [m5] = again.snapshot(node_store.db, 5, [5])
    assert not any(f.uploaded for f in m5.files if f.shared)

    # after a restore from a savepoint, nothing uploaded before counts
    again.forget()
    assert again.tracker.confirmed == {} and UploadTracker(again.tracker.path).confirmed == {}


def test_tracker_ignores_an_unreadable_record(tmp_path):
    path = tmp_path / "uploaded.json"
    path.write_text("{not json")
    assert UploadTracker(str(path)).confirmed == {}


def test_restore_partition_names_the_bad_file_and_leaves_nothing(node_store, storage_of, file_url, tmp_path):
    storage = storage_of(file_url)
    snap = snapshotter(storage, tmp_path)
    put(node_store, 3, 300, "a")
    [manifest] = snap.snapshot(node_store.db, 1, [3])
    victim = next(f for f in manifest.files if f.shared)
    storage.write_bytes(victim.path, b"garbage")
    target = str(tmp_path / "restored")
    with pytest.raises(CorruptCheckpointError, match=victim.path) as info:
        restore_partition(storage, manifest, target)
    assert info.value.data["partition"] == 3 and info.value.data["checkpoint_id"] == 1
    assert not os.path.exists(target)
    # the local snapshot still has a good copy: it is used instead of the bad remote one
    stats = restore_partition(storage, manifest, target, [snap.local_path(1)])
    assert stats.files_local == len(manifest.files) and stats.files_downloaded == 0


def test_the_upload_record_is_written_once_per_operation(tmp_path, monkeypatch):
    writes = []
    real = snapshot.write_json
    monkeypatch.setattr(snapshot, "write_json", lambda path, data, sync=True: writes.append((data["checkpoint_id"], sync)) or real(path, data, sync))
    snap = Snapshotter(None, str(tmp_path / "checkpoints"))  # confirm and forget touch no storage
    tracker = snap.tracker
    sst = {"000012.sst": FileEntry("000012.sst", "shared/sa/000012-4f1c.sst", 1 << 20, "crc32c:1a2b", True, True)}
    tracker.add_pending(3, sst)
    tracker.add_pending(4, sst)
    tracker.check_retained((3,))  # two transitions (3 confirmed, then kept): nothing written yet
    tracker.check_retained((4,))  # 4 confirmed in its place
    assert writes == [] and not os.path.exists(tracker.path)
    tracker.save()
    assert writes == [(4, False)]
    snap.confirm(4)  # already confirmed: nothing changed, nothing written
    assert writes == [(4, False)]
    snap.forget()  # a restore from a savepoint: written and synced at once
    assert writes == [(4, False), (None, True)]
    assert UploadTracker(tracker.path).confirmed_id is None


def test_a_manifest_naming_another_partitions_key_group_is_refused():
    m = PartitionManifest(3, 1, [], ["s"], key_group=KeyGroup("sa", 4, 2)).to_dict()
    with pytest.raises(CorruptCheckpointError):
        PartitionManifest.from_json(__import__("json").dumps(m).encode())


def test_a_group_is_named_by_each_of_its_partitions_and_refused_for_one_it_does_not_hold(node_store, storage_of, file_url, tmp_path):
    """``_metadata`` names a process's group of manifests once per partition (the same bytes, checked once); one it
    names for a partition the group does not hold is refused, as a stored manifest of another partition is."""
    from dataclasses import replace

    from rockstate.checkpoint.coordinator import _refs
    from rockstate.checkpoint.manifest import CheckpointMetadata
    from rockstate.checkpoint.restore import load_manifests

    storage = storage_of(file_url)
    put(node_store, 3, 10, "a")
    m3, m5 = snapshotter(storage, tmp_path).snapshot(node_store.db, 1, [3, 5])
    refs = _refs([m3, m5])
    stored = storage.read_bytes(group_path(1, "sa"))
    assert {(r.path, r.size, r.digest) for r in refs} == {(group_path(1, "sa"), len(stored), refs[0].digest)}
    meta = CheckpointMetadata(1, 2, [replace(refs[0], partition=0), replace(refs[1], partition=1)])  # as p0 and p1
    with pytest.raises(CorruptCheckpointError, match="holds no manifest of p0"):
        load_manifests(storage, meta, [0])
    meta = CheckpointMetadata(1, 2, refs)
    meta.partitions = 6  # (the two it names are all a load asks for)
    assert load_manifests(storage, meta, [3, 5]) == {3: m3, 5: m5}
