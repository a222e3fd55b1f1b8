"""The write acknowledgement rule, driven by hand: batches sent, applied and configured, with times."""

import pytest

from rockstate.control.in_sync import InSyncSets
from rockstate.control.write_acks import Batch, BackupApply, PrimaryAcks, Replication
from rockstate.errors import ReplicaBehindError, RockstateError, StaleEpochError


def test_a_batch_is_acknowledged_once_every_in_sync_backup_applied_it():
    acks = PrimaryAcks(epoch=3, positions={"node-2": 10, "node-3": 10}, last_seq=10)
    assert acks.send(now=1.0) == Batch(11, 3, acknowledged=False)
    assert acks.send(now=1.1) == Batch(12, 3, acknowledged=False)
    assert acks.applied("node-2", 12) == []  # node-3 has applied neither
    assert acks.applied("node-3", 11) == [11]
    assert acks.applied("node-3", 11) == []  # a repeated report
    assert acks.applied("node-3", 12) == [12]
    assert acks.acked == 12


def test_a_primary_without_backups_acknowledges_at_once():
    acks = PrimaryAcks(epoch=1, positions={})
    assert [acks.send(now=0.0) for _ in range(2)] == [Batch(1, 1, True), Batch(2, 1, True)]


def test_async_acknowledges_first_and_still_reports_a_lagging_backup():
    acks = PrimaryAcks(epoch=1, positions={"node-2": 0}, replication="async")
    assert acks.send(now=5.0) == Batch(1, 1, acknowledged=True)
    assert acks.overdue(now=5.4, max_lag=0.5) == [] and acks.overdue(now=5.6, max_lag=0.5) == ["node-2"]
    assert acks.applied("node-2", 1) == [] and acks.overdue(now=9.0, max_lag=0.5) == []
    assert acks.replication is Replication.ASYNC


def test_the_primary_waits_for_a_lagging_backup_until_the_coordinator_removes_it():
    acks = PrimaryAcks(epoch=3, positions={"node-2": 0, "node-3": 0})
    acks.send(now=0.0)
    acks.applied("node-2", 1)
    assert acks.overdue(now=2.0, max_lag=1.0) == ["node-3"]  # reported to the coordinator: still waited for
    assert acks.send(now=2.0).acknowledged is False
    assert acks.configure(epoch=3, backups=["node-2"], in_sync=["node-1", "node-2"]) == []  # not newer: ignored
    assert acks.acked == 0
    # the coordinator removed node-3 at epoch 4: only now the primary acknowledges without it
    assert acks.configure(epoch=4, backups=["node-2", "node-3"], in_sync=["node-1", "node-2"]) == [1]
    assert acks.applied("node-2", 2) == [2]
    assert acks.overdue(now=9.0, max_lag=1.0) == []


def test_a_caught_up_backup_is_waited_for_before_the_coordinator_counts_it():
    acks = PrimaryAcks(epoch=2, positions={})
    acks.configure(epoch=3, backups=["node-2"], in_sync=["node-1"])  # node-2 added, catching up
    assert acks.send(now=0.0).acknowledged  # not waited for yet
    acks.applied("node-2", 0)
    assert acks.caught_up("node-2") is False
    acks.applied("node-2", 1)
    assert acks.caught_up("node-2") is True
    assert acks.send(now=1.0).acknowledged is False  # waited for from the report on
    assert acks.applied("node-2", 2) == [2]
    assert acks.caught_up("node-2") is True
    assert acks.configure(epoch=4, backups=["node-2"], in_sync=["node-1", "node-2"]) == []  # the report taken
    assert acks.send(now=2.0).acknowledged is False and acks.applied("node-2", 3) == [3]
    assert acks.configure(epoch=5, backups=["node-2"], in_sync=["node-1"]) == [] and acks.send(now=3.0).acknowledged


def test_a_newer_epoch_that_does_not_count_a_reported_backup_ends_the_wait_for_it():
    """The coordinator refused the report (it was made at an older epoch, or the backup is copying anew): the
    primary must not wait for a backup that may be dropping its copy."""
    acks = PrimaryAcks(epoch=2, positions={})
    acks.configure(epoch=3, backups=["node-2"], in_sync=["node-1"])
    acks.send(now=0.0)
    acks.applied("node-2", 1)
    assert acks.caught_up("node-2") and acks.waits() == {"node-2"}
    assert acks.send(now=1.0).acknowledged is False
    assert acks.configure(epoch=4, backups=["node-2", "node-5"], in_sync=["node-1"]) == [2]  # another change: refused
    assert acks.waits() == set() and acks.send(now=2.0).acknowledged
    assert acks.overdue(now=100.0, max_lag=1.0) == []


def test_a_reported_backup_dropped_without_a_new_epoch_is_not_waited_for():
    """The coordinator dropped a backup that was not in sync (a re-placement): the table names it no more, at the
    same replica epoch. Waiting for it would stall the partition for good: nothing is sent to it any more."""
    acks = PrimaryAcks(epoch=2, positions={})
    acks.configure(epoch=3, backups=["node-1", "node-2"], in_sync=["node-1"])
    acks.send(now=0.0)
    acks.applied("node-1", 1)
    acks.applied("node-2", 1)
    assert acks.caught_up("node-2") and acks.waits() == {"node-1", "node-2"}
    assert acks.send(now=1.0).acknowledged is False and acks.applied("node-1", 2) == []  # node-2 is behind
    assert acks.configure(epoch=3, backups=["node-1"], in_sync=["node-1"]) == [2]
    assert acks.waits() == {"node-1"} and acks.send(now=2.0).acknowledged is False and acks.applied("node-1", 3) == [3]
    acks.applied("node-2", 3)  # an answer to what was sent before the drop: it does not bring node-2 back
    assert acks.caught_up("node-2") is False and acks.waits() == {"node-1"}
    assert acks.configure(epoch=3, backups=["node-1", "node-3"], in_sync=["node-1"]) == []  # one added, same epoch
    acks.applied("node-3", 3)
    assert acks.caught_up("node-3") and acks.waits() == {"node-1", "node-3"}


def test_a_backup_refuses_an_older_epoch_resends_and_gaps():
    backup = BackupApply(epoch=4, applied=7)
    with pytest.raises(StaleEpochError, match="epoch 3 .* replaced at epoch 4") as info:
        backup.check(3, 8)
    assert isinstance(info.value, RockstateError) and info.value.data == {"epoch": 4}
    assert backup.check(4, 7) is False  # held already
    with pytest.raises(ReplicaBehindError):
        backup.check(4, 9)
    assert backup.check(5, 8) is True  # a newer primary's batch: its epoch is the newest now
    backup.applied(8)
    with pytest.raises(StaleEpochError):
        backup.check(4, 9)
    backup.configure(6)
    with pytest.raises(StaleEpochError):
        backup.check(5, 9)


def test_after_a_promotion_the_deposed_primary_cannot_write_through_a_backup():
    sets = InSyncSets(1, [["node-1", "node-2", "node-3"]])
    old = PrimaryAcks(epoch=1, positions={"node-2": 0, "node-3": 0})
    on_node_3 = BackupApply(epoch=1)
    batch = old.send(now=0.0)
    assert on_node_3.check(batch.epoch, batch.seq)
    on_node_3.applied(batch.seq)
    sets.members_dead(["node-1"])  # cut off from the coordinator, declared dead
    publish = sets.positions(0, {"node-2": 0, "node-3": 1}, now=0.0)[0]
    assert publish.primary == "node-3"
    new = PrimaryAcks(epoch=publish.epoch, positions={"node-2": 0}, last_seq=1)
    on_node_2 = BackupApply(epoch=1)
    on_node_2.configure(publish.epoch)
    with pytest.raises(StaleEpochError):
        on_node_2.check(old.send(now=1.0).epoch, 1)
    assert new.send(now=1.0) == Batch(2, publish.epoch, acknowledged=False)
    assert new.applied("node-2", 1) == [] and new.applied("node-2", 2) == [2]  # the tail (no client waits on it), then the batch


def test_under_steady_writes_a_backup_one_request_behind_joins_and_is_reported():
    """A primary alone acknowledges each batch as it is sent; under steady writes a catching-up backup's answer
    never finds it level with the last batch sent (one was sent meanwhile). Applying all its request carried, it
    is waited for from then on, and reported once it holds every acknowledged batch (the next answer)."""
    acks = PrimaryAcks(epoch=2, positions={})
    acks.configure(epoch=3, backups=["node-2"], in_sync=[])  # node-2 copied the partition, catching up
    for n in range(5):
        assert acks.send(now=0.0).acknowledged
    carried = acks.last_sent  # a request with batches 1-5
    assert acks.send(now=0.1).acknowledged  # batch 6, acknowledged before the answer comes
    acks.applied("node-2", carried)
    assert acks.caught_up("node-2", carried) is False  # it lacks acknowledged batch 6: not reported yet
    assert acks.waits() == {"node-2"} and acks.send(now=0.2).acknowledged is False  # but batch 7 waits for it
    carried = acks.last_sent
    assert acks.applied("node-2", carried) == [7]
    assert acks.caught_up("node-2", carried) is True and acks.reported == {"node-2"}


def test_a_joining_backup_that_stops_answering_is_waited_for_no_more_until_reported():
    acks = PrimaryAcks(epoch=2, positions={})
    acks.configure(epoch=3, backups=["node-2"], in_sync=[])
    acks.send(now=0.0)
    acks.applied("node-2", 1)
    acks.send(now=0.0)  # batch 2, acknowledged without node-2
    assert acks.caught_up("node-2", 1) is False and acks.send(now=1.0).acknowledged is False  # batch 3 waits
    assert acks.overdue(now=5.0, max_lag=1.0) == ["node-2"]  # no answer: the coordinator does not count it
    assert acks.waits() == set() and acks.acked == 3
    acks.applied("node-2", 3)
    assert acks.caught_up("node-2", 3) is True  # it answered after all: joining and reported
    acks.send(now=6.0)
    assert acks.overdue(now=9.0, max_lag=1.0) == ["node-2"] and acks.waits() == {"node-2"}  # reported: waited for
