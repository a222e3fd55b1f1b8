"""The node-side pieces on their own: snapshot one partition, restore it elsewhere (as a node would)."""

import os

import msgpack
import pytest

from rockstate.checkpoint import snapshot
from rockstate.checkpoint.manifest import FileEntry, PartitionManifest
from rockstate.checkpoint.restore import restore_partition
from rockstate.checkpoint.snapshot import Snapshotter, UploadTracker
from rockstate.checkpoint.storage import manifest_path
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


def test_snapshot_one_partition_and_restore_it_on_another_node(node_store, storage_of, file_url, tmp_path):
    storage = storage_of(file_url)
    snap = Snapshotter(storage, str(tmp_path / "node-a" / "checkpoints"), keep_local=1)
    put(node_store, 3, 1000, "a")
    local = snap.sync_phase(node_store.partition(3), 1)
    assert local.pause_seconds < 1.0 and os.path.exists(os.path.join(local.path, "CURRENT")) and local.states == ["s"]
    put(node_store, 3, 1000, "b")  # after the barrier: not in checkpoint 1
    manifest = snap.async_phase(local)
    ack = msgpack.unpackb(msgpack.packb(manifest.to_dict()))  # what the node sends the coordinator
    assert PartitionManifest.from_dict(ack) == manifest
    assert storage.read_bytes(manifest_path(1, 3)) == manifest.to_json()
    assert manifest.uploaded_bytes == manifest.size

    other = Store(str(tmp_path / "node-b"), StoreConfig(partitions=8), owned=[])  # a node that does not own p3 yet
    stats = restore_partition(storage, manifest, other.partition_path(3))
    assert stats.files_downloaded == len(manifest.files) and stats.bytes_downloaded == manifest.size
    other.define_state(StateSpec("s", "value"))
    part = other.open_partition(3)
    assert part.get_many("s", [b"k1", b"k999"]) == [b"a1" * 10, b"a999" * 10]
    other.close()

    # the next snapshot references the confirmed files and uploads only what is new
    snap.confirm(3, 1)
    manifest2 = snap.snapshot(node_store.partition(3), 2)
    assert manifest2.uploaded_bytes < manifest2.size
    assert not os.path.exists(snap.local_path(3, 1)) and os.path.exists(snap.local_path(3, 2))  # keep_local=1


def test_unconfirmed_or_dropped_checkpoints_are_never_referenced(node_store, storage_of, file_url, tmp_path):
    storage = storage_of(file_url)
    snap = Snapshotter(storage, str(tmp_path / "node-a" / "checkpoints"))
    put(node_store, 5, 500, "a")
    m1 = snap.snapshot(node_store.partition(5), 1)
    m2 = snap.snapshot(node_store.partition(5), 2)  # 1 was never confirmed: its files may be deleted
    assert m2.uploaded_bytes == m2.size
    m3 = snap.snapshot(node_store.partition(5), 3, retained=(2,))  # the barrier says 2 completed: confirmed now
    assert {f.path for f in m3.files if f.shared} == {f.path for f in m2.files if f.shared}
    assert not any(f.uploaded for f in m3.files if f.shared)
    m4 = snap.snapshot(node_store.partition(5), 4, retained=(7,))  # 2 and 3 are no longer retained
    assert all(f.uploaded for f in m4.files)
    assert m1.checkpoint_id == 1

    # the upload record survives a restart of the process
    snap.confirm(5, 4)
    again = Snapshotter(storage, str(tmp_path / "node-a" / "checkpoints"))
    m5 = again.snapshot(node_store.partition(5), 5)
    assert not any(f.uploaded for f in m5.files if f.shared)

    # after a restore, only the restored checkpoint's files count
    again.reset(5, m1)
    assert again.tracker(5).confirmed_id == 1 and set(again.tracker(5).confirmed) == {f.name for f in m1.files if f.shared}
    again.reset(5, m1, reference=False)
    assert again.tracker(5).confirmed == {}


def test_tracker_ignores_an_unreadable_record(tmp_path):
    path = tmp_path / "uploaded.json"
    path.write_text("{not json")
    assert UploadTracker(str(path)).confirmed == {}


def test_restore_partition_names_the_bad_file_and_leaves_nothing(node_store, storage_of, file_url, tmp_path):
    storage = storage_of(file_url)
    snap = Snapshotter(storage, str(tmp_path / "node-a" / "checkpoints"))
    put(node_store, 3, 300, "a")
    manifest = snap.snapshot(node_store.partition(3), 1)
    victim = next(f for f in manifest.files if f.shared)
    storage.write_bytes(victim.path, b"garbage")
    target = str(tmp_path / "restored")
    with pytest.raises(CorruptCheckpointError, match=victim.path) as info:
        restore_partition(storage, manifest, target)
    assert info.value.data["partition"] == 3 and info.value.data["checkpoint_id"] == 1
    assert not os.path.exists(target)
    # the local snapshot still has a good copy: it is used instead of the bad remote one
    stats = restore_partition(storage, manifest, target, [snap.local_path(3, 1)])
    assert stats.files_local == len(manifest.files) and stats.files_downloaded == 0


def test_the_upload_record_is_written_once_per_operation_and_synced_after_a_restore(tmp_path, monkeypatch):
    writes = []
    real = snapshot.write_json
    monkeypatch.setattr(snapshot, "write_json", lambda path, data, sync=True: writes.append((data["checkpoint_id"], sync)) or real(path, data, sync))
    snap = Snapshotter(None, str(tmp_path / "checkpoints"))  # confirm and reset touch no storage
    tracker = snap.tracker(5)
    sst = {"000012.sst": FileEntry("000012.sst", "shared/p0005/000012-4f1c.sst", 1 << 20, "crc32c:1a2b", True, True)}
    tracker.add_pending(3, sst)
    tracker.add_pending(4, sst)
    tracker.check_retained((3,))  # two transitions (3 confirmed, then kept): nothing written yet
    tracker.check_retained((4,))  # 4 confirmed in its place
    assert writes == [] and not os.path.exists(tracker.path)
    tracker.save()
    assert writes == [(4, False)]
    snap.confirm(5, 4)  # already confirmed: nothing changed, nothing written
    assert writes == [(4, False)]
    snap.reset(5, PartitionManifest(5, 2, list(sst.values()), ["s"]))  # a restore: written and synced at once
    assert writes == [(4, False), (2, True)]
    assert UploadTracker(tracker.path).confirmed_id == 2
