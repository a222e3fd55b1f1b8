"""The checkpoint coordinator's state machine, driven by hand: no I/O, explicit times."""

import msgpack
import pytest

from rockstate.checkpoint.coordinator import (
    ABORTED,
    COMPLETED,
    Aborted,
    CheckpointCoordinator,
    CheckpointPolicy,
    CheckpointRecord,
    Completed,
    SWEEP_EVERY,
    CompletedCheckpoint,
    Discard,
    Trigger,
    WriteMetadata,
    plan_retention,
    plan_sweep,
    unreferenced,
)
from rockstate.checkpoint.manifest import CheckpointMetadata, FileEntry, PartitionManifest
from rockstate.errors import CheckpointError, CheckpointInProgressError


def manifest(chk, pid, shared=(), new=()):
    files = [FileEntry(n, f"shared/p{pid:04d}/{n}", 10, "crc32:00000000", True, uploaded=n in new) for n in shared]
    files.append(FileEntry("CURRENT", f"chk-{chk:06d}/p{pid:04d}/CURRENT", 16, "crc32:00000001", False, uploaded=True))
    return PartitionManifest(pid, chk, files, ["s"], sync_seconds=0.001 * (pid + 1))


def complete(coord, now, shared_by_pid=None, new_by_pid=None):
    trig = coord.trigger(now)
    action = None
    for pid in range(coord.partitions):
        shared = (shared_by_pid or {}).get(pid, ())
        action = coord.ack(trig.checkpoint_id, manifest(trig.checkpoint_id, pid, shared, (new_by_pid or {}).get(pid, shared)).to_dict(), now)
    assert isinstance(action, WriteMetadata)
    return coord.metadata_written(trig.checkpoint_id, now + 1)


def test_acks_complete_a_checkpoint_and_metadata_names_every_manifest():
    coord = CheckpointCoordinator(3, CheckpointPolicy(), cluster="c1")
    trig = coord.trigger(100.0, states={"s": {"name": "s", "kind": "value", "ttl": None}})
    assert trig == Trigger(1, ())
    assert coord.ack(1, manifest(1, 0, ["a.sst"]).to_dict(), 100.5) is None
    assert coord.ack(1, manifest(1, 0, ["a.sst"]).to_dict(), 100.6) is None  # a retried ack
    assert coord.ack(1, manifest(1, 2), 100.7) is None  # a PartitionManifest works as well as its dict
    action = coord.ack(1, manifest(1, 1), 101.0)
    assert isinstance(action, WriteMetadata) and action.checkpoint_id == 1
    meta = action.metadata
    assert [m.path for m in meta.manifests] == ["chk-000001/p0000.json", "chk-000001/p0001.json", "chk-000001/p0002.json"]
    assert meta.cluster == "c1" and meta.states["s"]["kind"] == "value" and meta.duration == pytest.approx(1.0)
    # the metadata survives both encodings unchanged
    assert CheckpointMetadata.from_json(meta.to_json()).to_dict() == meta.to_dict()
    assert CheckpointMetadata.from_dict(msgpack.unpackb(msgpack.packb(meta.to_dict()))).to_dict() == meta.to_dict()
    done = coord.metadata_written(1, 102.0)
    assert isinstance(done, Completed) and done.drop_checkpoints == ()
    rec = done.record
    assert (rec.id, rec.state, rec.duration, rec.max_pause) == (1, COMPLETED, 2.0, pytest.approx(0.003))
    assert rec.size == 10 + 3 * 16 and rec.bytes_uploaded == 3 * 16  # a.sst was referenced, not uploaded
    assert coord.latest_completed == 1 and coord.retained_ids == (1,)
    assert coord.retained_paths() == {1: frozenset({"shared/p0000/a.sst"})}


def test_manifest_roundtrips_through_msgpack_and_json():
    m = manifest(7, 3, ["a.sst", "b.sst"], new=["b.sst"])
    wire = msgpack.unpackb(msgpack.packb(m.to_dict()))
    assert PartitionManifest.from_dict(wire) == m
    assert PartitionManifest.from_json(m.to_json()) == m
    assert m.uploaded_bytes == 10 + 16 and m.size == 36
    assert m.to_json() == PartitionManifest.from_dict(wire).to_json()  # canonical bytes: the checksum is reproducible


def test_one_checkpoint_in_flight_and_ids_increase_after_the_storages():
    coord = CheckpointCoordinator(1, existing_ids=[4, 9])
    assert coord.trigger(0.0).checkpoint_id == 10
    with pytest.raises(CheckpointInProgressError):
        coord.trigger(1.0)
    coord.fail(10, "boom", 2.0)
    assert coord.trigger(3.0).checkpoint_id == 11  # an aborted id is never reused


def test_periodic_triggers_honour_interval_and_min_pause_manual_ones_do_not():
    coord = CheckpointCoordinator(1, CheckpointPolicy(interval=10.0, min_pause=4.0))
    [trig] = coord.tick(0.0)
    assert isinstance(trig, Trigger) and coord.history()[0].trigger == "periodic"
    assert coord.tick(5.0) == []  # in flight
    coord.ack(trig.checkpoint_id, manifest(trig.checkpoint_id, 0), 9.0)
    coord.metadata_written(trig.checkpoint_id, 9.0)
    assert coord.next_periodic() == 13.0  # max(0 + interval, 9 + min pause)
    assert coord.tick(12.9) == []
    [trig2] = coord.tick(13.0)
    coord.ack(trig2.checkpoint_id, manifest(trig2.checkpoint_id, 0), 13.5)
    coord.metadata_written(trig2.checkpoint_id, 13.5)
    assert coord.trigger(13.6).checkpoint_id == 3  # manual: no minimum pause
    assert CheckpointCoordinator(1).tick(0.0) == []  # no interval: manual only


def test_timeout_aborts_and_lists_the_partial_files():
    coord = CheckpointCoordinator(2, CheckpointPolicy(timeout=5.0, tolerable_failures=1))
    trig = coord.trigger(0.0)
    coord.ack(trig.checkpoint_id, manifest(1, 0, ["old.sst", "new.sst"], new=["new.sst"]), 1.0)
    assert coord.next_wakeup() == 5.0
    assert coord.tick(4.9) == []
    [aborted] = coord.tick(5.0)
    assert isinstance(aborted, Aborted)
    assert aborted.delete_dir == "chk-000001"
    assert aborted.delete_files == ("shared/p0000/new.sst",)  # never a file it only referenced
    assert not aborted.failures_exceeded
    assert aborted.record.state == ABORTED and "timed out" in aborted.record.failure and "1 of 2" in aborted.record.failure
    # a late ack of the aborted checkpoint: what it uploaded goes
    late = coord.ack(1, manifest(1, 1, ["x.sst"], new=["x.sst"]), 6.0)
    assert isinstance(late, Discard) and set(late.delete_files) == {"shared/p0001/x.sst", "chk-000001/p0001/CURRENT", "chk-000001/p0001.json"}
    coord.trigger(7.0)
    second = coord.decline(2, 1, "disk full", 8.0)
    assert second.failures_exceeded and coord.consecutive_failures == 2
    assert "partition 1: disk full" in second.record.failure
    complete(coord, 9.0)
    assert coord.consecutive_failures == 0  # a completion resets the count
    states = [(r.checkpoint_id, r.state) for r in coord.history()]
    assert states == [(1, ABORTED), (2, ABORTED), (3, COMPLETED)]


def test_the_storage_is_listed_after_the_first_completion_an_abort_or_a_while_not_after_every_checkpoint():
    coord = CheckpointCoordinator(1, CheckpointPolicy(timeout=5.0))
    complete(coord, 0.0)
    assert coord.sweep_due(1.0)  # a new coordinator: an earlier one may have left files behind
    coord.swept(1.0)
    complete(coord, 2.0)
    assert not coord.sweep_due(3.0)  # a listing is O(files stored): not per checkpoint
    coord.trigger(4.0)
    coord.tick(9.0)  # aborted: what its uploads left is garbage
    assert coord.sweep_due(10.0)
    coord.swept(10.0)
    assert not coord.sweep_due(10.0 + SWEEP_EVERY - 1) and coord.sweep_due(10.0 + SWEEP_EVERY)


def test_retention_drops_old_checkpoints_and_only_files_no_retained_one_uses():
    coord = CheckpointCoordinator(1, CheckpointPolicy(retained=2))
    complete(coord, 0.0, {0: ["a.sst", "b.sst"]})
    complete(coord, 10.0, {0: ["a.sst", "c.sst"]}, {0: ["c.sst"]})
    done = complete(coord, 20.0, {0: ["a.sst", "d.sst"]}, {0: ["d.sst"]})
    assert done.drop_checkpoints == (1,)
    assert done.delete_files == ("shared/p0000/b.sst",)  # a.sst is still used by 2 and 3
    with pytest.raises(CheckpointInProgressError):
        coord.trigger(21.0)  # garbage collection first
    coord.gc_done()
    assert coord.retained_ids == (2, 3)
    assert [r.retained for r in coord.history()] == [False, True, True]
    done = complete(coord, 30.0, {0: ["e.sst"]})
    coord.gc_done()
    assert done.drop_checkpoints == (2,) and done.delete_files == ("shared/p0000/c.sst",)


def test_coordinator_started_on_existing_checkpoints_keeps_their_files():
    old = [CompletedCheckpoint(i, frozenset({f"shared/p0000/{i}.sst", "shared/p0000/common.sst"}), CheckpointRecord(i, COMPLETED, "storage", 0, 1)) for i in (3, 5)]
    coord = CheckpointCoordinator(1, CheckpointPolicy(retained=1), existing_ids=[6], completed=old)
    assert coord.next_id == 7 and coord.latest_completed == 5
    done = complete(coord, 0.0, {0: ["common.sst"]})
    assert done.drop_checkpoints == (3, 5)
    assert set(done.delete_files) == {"shared/p0000/3.sst", "shared/p0000/5.sst"}


def test_pure_retention_helpers():
    assert plan_retention([5, 1, 3], 2) == ([3, 5], [1])
    assert plan_retention([1], 5) == ([1], [])
    rec = CheckpointRecord(0, COMPLETED, "manual", 0, 1)
    a = CompletedCheckpoint(1, frozenset({"x", "y"}), rec)
    b = CompletedCheckpoint(2, frozenset({"y", "z"}), rec)
    assert unreferenced([a], [b]) == {"x"}
    listed = [
        "chk-000001/_metadata",
        "chk-000002/p0000.json",
        "chk-000003/p0000.json",
        "chk-000004/p0000.json",
        "shared/p0000/x",
        "shared/p0000/y",
        "shared/p0000/orphan",
        "savepoints/sp/shared/p0000/x",
        "README",
    ]
    assert plan_sweep(listed, {2: {"shared/p0000/y"}}, in_flight=4) == [
        "chk-000001/_metadata",
        "chk-000003/p0000.json",
        "shared/p0000/x",
        "shared/p0000/orphan",
    ]


def test_errors_for_wrong_ids():
    coord = CheckpointCoordinator(1)
    with pytest.raises(CheckpointError):
        coord.metadata_written(1, 0.0)
    coord.trigger(0.0)
    with pytest.raises(CheckpointError):
        coord.metadata_written(1, 0.0)  # no acks yet
    with pytest.raises(CheckpointError):
        coord.ack(1, manifest(2, 0), 0.0)  # the manifest of another checkpoint
    assert coord.fail(99, "x", 0.0) is None and coord.decline(99, 0, "x", 0.0) is None
