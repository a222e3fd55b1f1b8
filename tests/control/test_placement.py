"""The coordinator's planner: owners and members' statuses in, moves and failovers out."""

import pytest

from rockstate.control.membership import MemberStatus
from rockstate.control.placement import FailoverPlan, Move, by_owner, failover, rebalance
from rockstate.errors import PartitionUnavailableError

ALIVE, DEAD, LEAVING = MemberStatus.ALIVE, MemberStatus.DEAD, MemberStatus.LEAVING


def test_a_new_cluster_assigns_every_partition():
    assert rebalance([None] * 4, {"node-1": ALIVE, "node-2": ALIVE}) == [
        Move(0, None, "node-1"), Move(1, None, "node-1"), Move(2, None, "node-2"), Move(3, None, "node-2")]
    assert rebalance([None] * 4, {"node-1": DEAD}) == []


def test_a_join_moves_the_fewest_and_a_leave_empties_the_leaving_node():
    owners = ["node-1", "node-1", "node-2", "node-2"]
    assert rebalance(owners, {"node-1": ALIVE, "node-2": ALIVE, "node-3": ALIVE}) == [Move(3, "node-2", "node-3")]
    assert rebalance(owners, {"node-1": LEAVING, "node-2": ALIVE}) == [Move(0, "node-1", "node-2"), Move(1, "node-1", "node-2")]


def test_a_dead_nodes_partitions_stay_for_it():
    owners = ["node-1", "node-1", "node-2", "node-2"]
    assert rebalance(owners, {"node-1": DEAD, "node-2": ALIVE, "node-3": ALIVE}) == [Move(3, "node-2", "node-3")]


def test_failover_restores_a_dead_nodes_partitions_on_the_live_ones():
    owners = ["node-1", "node-2", "node-3", "node-1", "node-2", "node-3"]
    statuses = {"node-1": DEAD, "node-2": ALIVE, "node-3": ALIVE}
    plan = failover(owners, statuses, "node-1")
    assert plan.new_owner == {0: "node-2", 3: "node-3"}
    assert plan.by_target() == {"node-2": [0], "node-3": [3]}
    assert plan.owners(owners) == ["node-2", "node-2", "node-3", "node-3", "node-2", "node-3"]
    assert failover(owners, {"node-1": DEAD, "node-2": DEAD, "node-3": DEAD}, "node-1") is None  # waits for a live node
    assert failover(owners, {**statuses, "node-1": ALIVE}, "node-1") == FailoverPlan()  # it came back with its data
    assert failover(plan.owners(owners), statuses, "node-1") == FailoverPlan()  # done already


def test_by_owner_needs_a_live_owner_for_every_partition():
    owners = ["node-1", "node-2", "node-1"]
    assert by_owner(owners, {"node-1": ALIVE, "node-2": ALIVE}) == [("node-1", [0, 2]), ("node-2", [1])]
    with pytest.raises(PartitionUnavailableError, match=r"\[0, 2\] have no live owner") as info:
        by_owner(owners, {"node-1": DEAD, "node-2": ALIVE})
    assert info.value.data["partitions"] == [0, 2]
    with pytest.raises(PartitionUnavailableError):
        by_owner([None, "node-2"], {"node-2": ALIVE})
