"""A node's ownership of partitions, driven by hand: tables, times and move steps in, answers out."""

import pytest

from rockstate.control.ownership import Ownership, Phase, TableChange
from rockstate.errors import NotOwnerError, PartitionRangeError, PartitionUnavailableError

ME, OTHER = "node-1", "node-2"


def apply(own: Ownership, epoch: int, owners: list, since: list) -> TableChange | None:
    """A table, and the node opening what it gives (as ``Node._apply`` does)."""
    change = own.apply_table(epoch, owners, since)
    for pid in change.opened if change else ():
        own.opened(pid)
    return change


def joined(now=100.0) -> Ownership:
    own = Ownership()
    own.join(ME, 4, lease=2.5, sent=now)
    assert apply(own, 3, [ME, OTHER, ME, None], [1, 2, 3, 0]) == TableChange(opened=(0, 2), retired=())
    return own


def test_a_table_gives_partitions_at_their_epoch_and_older_tables_are_ignored():
    own = joined()
    assert own.owned() == [0, 2] and own.phase[0] is Phase.SERVING
    assert own.check(0, 1, 101.0) == 0
    assert own.check(2, 5, 101.0) == 2
    with pytest.raises(NotOwnerError) as info:  # a client routing by a table from before partition 2 came here
        own.check(2, 2, 101.0)
    assert info.value.data == {"partition": 2, "epoch": 3} and "owner: node-1, table epoch 3" in str(info.value)
    with pytest.raises(NotOwnerError, match="owner: node-2"):
        own.check(1, 9, 101.0)
    assert apply(own, 3, [OTHER] * 4, [4] * 4) is None  # not newer
    assert own.owned() == [0, 2]
    assert apply(own, 4, [OTHER, OTHER, ME, ME], [4, 2, 3, 4]) == TableChange(opened=(3,), retired=(0,))
    assert own.owned() == [2, 3]


def test_a_partition_given_is_served_once_open_and_one_taken_away_at_once():
    own = joined()
    change = own.apply_table(4, [OTHER, ME, ME, ME], [4, 4, 3, 4])
    assert change == TableChange(opened=(1, 3), retired=(0,))
    with pytest.raises(NotOwnerError):
        own.check(0, 4, 101.0)  # taken away: refused before its files are retired
    with pytest.raises(NotOwnerError):
        own.check(1, 4, 101.0)  # given, not open yet
    own.opened(1)
    assert own.check(1, 4, 101.0) == 1 and own.owned() == [1, 2]


def test_the_lease_fences_client_requests_not_the_coordinators():
    own = joined(now=100.0)
    assert own.check(0, 3, 102.5) == 0
    with pytest.raises(PartitionUnavailableError, match=r"for 3\.0s \(lease 2\.5s\)") as info:
        own.check(0, 3, 103.0)
    assert info.value.retryable
    assert own.check(0, 3, 103.0, leased=False) == 0  # a checkpoint barrier from the coordinator itself
    own.renewed(102.0)
    assert own.check(0, 3, 104.0) == 0


def test_a_late_renewal_never_shortens_the_lease():
    """A heartbeat's renewal waits for the newer table it named to be applied: a later heartbeat may renew first."""
    own = joined(now=100.0)
    own.renewed(102.0)
    own.renewed(101.0)  # the earlier heartbeat's, after its table was applied
    assert own.check(0, 3, 104.0) == 0


def test_partitions_out_of_range_are_named():
    own = joined()
    for bad in (4, -1, "0", 1.0, None):
        with pytest.raises(PartitionRangeError, match=r"out of range 0\.\.3"):
            own.check(bad, 3, 101.0)


def test_a_move_out_copies_hands_over_and_releases_until_the_new_table():
    own = joined()
    assert own.copy(0) == 0 and own.phase[0] is Phase.COPYING
    with pytest.raises(PartitionUnavailableError, match="being copied"):
        own.check_ingest(0, 3)  # an ingest cannot be recorded for the target
    assert own.check(0, 3, 101.0) == 0  # writes go on, recorded
    apply(own, 4, [ME, OTHER, ME, None], [1, 2, 3, 0])  # another move's commit: this one goes on
    assert own.phase[0] is Phase.COPYING
    own.freeze(0)
    assert 0 in own.frozen
    own.delta(0, final=False)
    assert own.phase[0] is Phase.COPYING
    own.delta(0, final=True)
    assert own.phase[0] is Phase.HANDED_OVER
    assert own.release(0) is True and 0 not in own.frozen  # writes that waited learn the new owner
    assert own.phase[0] is Phase.RELEASED and own.owned() == [2]
    with pytest.raises(NotOwnerError):
        own.check(0, 9, 101.0)
    with pytest.raises(NotOwnerError):
        own.copy(0)
    assert own.release(0) is False
    # a table sent before the commit still names this node: the partition is not served again
    assert apply(own, 5, [ME, OTHER, ME, None], [1, 2, 3, 0]) == TableChange()
    assert own.phase[0] is Phase.RELEASED
    assert apply(own, 6, [OTHER, OTHER, ME, None], [6, 2, 3, 0]) == TableChange(retired=(0,))
    assert 0 not in own.phase


def test_a_failed_move_serves_on_and_a_thaw_ends_every_move():
    own = joined()
    own.copy(0)
    own.freeze(0)
    own.unfreeze(0)
    own.discard(0)
    assert own.phase[0] is Phase.SERVING and not own.frozen
    own.check_ingest(0, 3)
    own.copy(2)
    own.freeze(2)
    own.copy(0)
    own.delta(0, final=True)
    own.release(0)
    own.freeze(3)  # restoring a partition about to be owned
    assert own.thaw() == [2]
    assert own.phase == {2: Phase.SERVING} and not own.frozen
    # the released partition is served again once the restarted coordinator's table names it
    assert apply(own, 4, [ME, OTHER, ME, None], [1, 2, 3, 0]) == TableChange(opened=(0,))
    assert own.owned() == [0, 2]


def test_an_ingest_checks_ownership_at_its_epoch():
    own = joined()
    with pytest.raises(NotOwnerError, match="any more"):
        own.check_ingest(1, 3)
    with pytest.raises(NotOwnerError):
        own.check_ingest(2, 2)
    own.check_ingest(2, 3)
