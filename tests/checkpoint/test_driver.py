"""The checkpoint driver with fake participants: what it sends whom, when it aborts, how it restores.

The participants are fakes standing in for a store's partitions or a node (the
real ones are exercised end to end in test_checkpoint.py and
test_cluster_checkpoints.py); the storage is a real one on the local disk.
"""

import asyncio
import time

import pytest

from rockstate.checkpoint.coordinator import CheckpointPolicy
from rockstate.checkpoint.driver import CheckpointDriver
from rockstate.checkpoint.manifest import FileEntry, PartitionManifest
from rockstate.checkpoint.restore import PartitionRestore
from rockstate.checkpoint.storage import CheckpointStorage, manifest_path, metadata_path
from rockstate.errors import (CheckpointAbortedError, CorruptCheckpointError, PartitionCountError,
                              PartitionUnavailableError, SavepointExistsError)
from rockstate.store import StateSpec

P = 4


class FakeNode:
    """Answers a barrier with a manifest per partition (after ``delay``, or never while ``hang`` is set)."""

    def __init__(self, name, storage, fail=None, delay=0.0):
        self.name, self.storage, self.fail, self.delay = name, storage, fail, delay
        self.hang = asyncio.Event() if delay is None else None
        self.calls = []
        self.corrupt: set[int] = set()  # checkpoints whose files this node finds damaged on restore

    def __str__(self):
        return f"node {self.name}"

    async def snapshot(self, chk, retained, pids):
        self.calls.append(("snapshot", chk, tuple(retained), tuple(pids)))
        if self.hang is not None:
            await self.hang.wait()
        await asyncio.sleep(self.delay or 0)
        if self.fail:
            raise self.fail
        manifests = []
        for pid in pids:
            rel = f"shared/p{pid:04d}/{chk:06d}-order-events.sst"
            self.storage.write_bytes(rel, b"sst of " + rel.encode())
            manifest = PartitionManifest(pid, chk, [FileEntry("000012.sst", rel, 10, "crc", True, True)], ["orders"])
            self.storage.write_bytes(manifest_path(chk, pid), manifest.to_json())
            manifests.append(manifest)
        return manifests

    async def finish(self, chk, completed, pids):
        self.calls.append(("finish", chk, completed, tuple(pids)))

    async def restore(self, chk, pids, base=""):
        self.calls.append(("restore", chk, tuple(pids), base))
        if chk in self.corrupt:
            raise CorruptCheckpointError(f"shared/p{pids[0]:04d}/x.sst of checkpoint {chk} fails its checksum")
        return [PartitionRestore(pid, chk, files_downloaded=1, bytes_downloaded=10) for pid in pids]


@pytest.fixture
def storage(tmp_path):
    s = CheckpointStorage(f"file://{tmp_path}/storage", cluster="orders-pipeline")
    yield s
    s.close()


def driver_for(storage, nodes, *, timeout=30.0, interval=None, partitions=P, **options):
    """A driver whose partitions are split over ``nodes`` (partition i on node i % len(nodes))."""
    events = []
    layout = [(n, [pid for pid in range(P) if pid % len(nodes) == i]) for i, n in enumerate(nodes)]
    specs = {"orders": StateSpec("orders", "value"), "carts": StateSpec("carts", "map", 3600.0)}
    driver = CheckpointDriver(storage, partitions, CheckpointPolicy(retained=2, interval=interval, timeout=timeout),
                              options.pop("holders", lambda: layout), specs=lambda: specs,
                              event=lambda event, **data: events.append((event, data)), **options)
    return driver, events


def run(coro):
    return asyncio.run(coro)


def test_a_checkpoint_sends_each_holder_its_partitions_and_commits(storage):
    async def main():
        a, b = FakeNode("a", storage), FakeNode("b", storage)
        driver, events = driver_for(storage, [a, b])
        await driver.open()
        record = await driver.checkpoint()
        assert (record.checkpoint_id, record.state, record.trigger, record.acked) == (1, "COMPLETED", "manual", P)
        assert a.calls == [("snapshot", 1, (), (0, 2)), ("finish", 1, True, (0, 2))]
        assert b.calls == [("snapshot", 1, (), (1, 3)), ("finish", 1, True, (1, 3))]
        assert storage.exists(metadata_path(1)) and driver.latest() == 1
        second = await driver.checkpoint()
        assert a.calls[-2] == ("snapshot", second.checkpoint_id, (1,), (0, 2))  # retained checkpoints go with the barrier
        assert [e for e, _ in events] == ["checkpoint_completed", "checkpoint_completed"]
        meta = await driver.inspect(1)
        assert set(meta.states) == {"orders", "carts"} and meta.states["carts"]["ttl"] == 3600.0

    run(main())


def test_a_failing_holder_aborts_the_checkpoint_and_everyone_hears_it(storage):
    async def main():
        a, b = FakeNode("a", storage), FakeNode("b", storage, fail=OSError("disk full on /data"), delay=0.05)
        driver, events = driver_for(storage, [a, b])
        await driver.open()
        with pytest.raises(CheckpointAbortedError, match="node b: OSError: disk full") as info:
            await driver.checkpoint()
        assert info.value.data["checkpoint_id"] == 1 and info.value.data["consecutive_failures"] == 1
        assert a.calls[-1] == ("finish", 1, False, (0, 2)) and b.calls[-1] == ("finish", 1, False, (1, 3))
        assert not storage.exists(metadata_path(1)) and not storage.exists(manifest_path(1, 0))
        assert events[-1][0] == "checkpoint_aborted" and driver.history()[-1].state == "ABORTED"
        b.fail = None
        assert (await driver.checkpoint()).checkpoint_id == 2

    run(main())


def test_the_timeout_aborts_at_the_real_deadline(storage):
    async def main():
        a, stuck = FakeNode("a", storage), FakeNode("stuck", storage, delay=None)
        driver, _ = driver_for(storage, [a, stuck], timeout=0.3)
        await driver.open()
        start = time.monotonic()
        with pytest.raises(CheckpointAbortedError, match=r"timed out after 0.3 s \(2 of 4 partitions acked\)"):
            await driver.checkpoint()
        assert 0.3 <= time.monotonic() - start < 5
        assert stuck.calls[-1] == ("finish", 1, False, (1, 3))
        record = driver.history()[-1]
        assert record.state == "ABORTED" and 0.3 <= record.duration < 5  # the deadline, not a time made up past it
        assert storage.list() == []  # the acked partitions' uploads and the checkpoint's folder are gone

    run(main())


def test_a_partition_without_a_holder_begins_nothing(storage):
    def no_owner():
        raise PartitionUnavailableError("partitions [3] have no live owner", partitions=[3])

    async def main():
        driver, _ = driver_for(storage, [FakeNode("a", storage)], holders=no_owner)
        await driver.open()
        for _ in range(2):
            with pytest.raises(PartitionUnavailableError):
                await driver.checkpoint()
        assert driver.history() == [] and driver.machine.in_flight is None

    run(main())


def test_the_periodic_schedule_triggers_and_a_stop_lets_the_checkpoint_in_flight_finish(storage):
    async def main():
        a = FakeNode("a", storage, delay=0.05)
        driver, _ = driver_for(storage, [a], interval=0.05)
        await driver.open()
        schedule = asyncio.create_task(driver.periodic())
        while len([r for r in driver.history() if r.state == "COMPLETED"]) < 3:
            await asyncio.sleep(0.01)
        while driver.machine.in_flight is None:  # stop it in the middle of one
            await asyncio.sleep(0.001)
        schedule.cancel()
        await driver.idle()
        assert {r.trigger for r in driver.history()} == {"periodic"}
        assert [r.state for r in driver.history()] == ["COMPLETED"] * len(driver.history())

    run(main())


def test_restore_falls_back_past_a_damaged_checkpoint_and_adopts_its_states(storage):
    adopted = []

    async def adopt(states):
        adopted.append(sorted(states))

    async def main():
        a, b = FakeNode("a", storage), FakeNode("b", storage)
        driver, events = driver_for(storage, [a, b], adopt_states=adopt)
        await driver.open()
        first, second = await driver.checkpoint(), await driver.checkpoint()
        b.corrupt.add(second.checkpoint_id)
        result = await driver.restore()
        assert result.checkpoint_id == first.checkpoint_id and result.source == "checkpoint"
        assert [s.checkpoint_id for s in result.skipped] == [second.checkpoint_id] and "fails its checksum" in result.skipped[0].reason
        assert sorted(p.partition for p in result.partitions) == list(range(P)) and result.bytes_downloaded == 10 * P
        assert driver.last_restore is result and adopted == [["carts", "orders"]] * 2
        assert [e for e, _ in events][-2:] == ["checkpoint_skipped", "cluster_restored"]
        with pytest.raises(CorruptCheckpointError):
            await driver.restore(second.checkpoint_id, fallback=False)
        # failover: chosen partitions on a chosen holder, from one checkpoint
        c = FakeNode("c", storage)
        stats = await driver.restore_partitions(first.checkpoint_id, [(c, [1, 3])])
        assert [s.partition for s in stats] == [1, 3] and c.calls == [("restore", first.checkpoint_id, (1, 3), "")]

    run(main())


def test_restore_refuses_another_partition_count_and_savepoint_names_are_unique(storage):
    async def main():
        driver, _ = driver_for(storage, [FakeNode("a", storage)])
        await driver.open()
        chk = (await driver.checkpoint()).checkpoint_id
        other, _ = driver_for(storage, [FakeNode("a", storage)], partitions=8)
        await other.open()
        with pytest.raises(PartitionCountError):
            await other.restore(chk)
        info = await driver.savepoint("before-upgrade")
        assert info.checkpoint_id == chk + 1
        with pytest.raises(SavepointExistsError):
            await driver.savepoint("before-upgrade")
        assert driver.latest() == chk + 1  # refused before taking a checkpoint
        assert [s.name for s in await driver.savepoints()] == ["before-upgrade"]

    run(main())
