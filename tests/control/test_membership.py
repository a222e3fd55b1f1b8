"""The coordinator's members, driven by hand: registrations, heartbeats and times in."""

import pytest

from rockstate.control.membership import Membership, MemberStatus
from rockstate.errors import MembershipChangeError, UnknownNodeError

A, B = "10.0.0.1:7701", "10.0.0.2:7701"


def test_register_heartbeat_expire_and_return():
    ms = Membership(heartbeat_timeout=5.0)
    assert ms.register(None, A, 0.0) == ("node-1", True)
    assert ms.register(None, B, 1.0) == ("node-2", True)
    assert ms.register("node-1", "10.0.0.9:7701", 2.0) == ("node-1", False)  # a restart, at a new address
    assert ms.addresses() == {"node-1": "10.0.0.9:7701", "node-2": B}
    assert ms.register("node-7", A, 2.0) == ("node-7", True)  # unknown under its old id: it joins as itself
    assert ms.heartbeat("node-2", 4.0) is False
    assert ms.expire(6.9) == [] and [m.node_id for m in ms.expire(7.1)] == ["node-1", "node-7"]
    assert ms["node-1"].status is MemberStatus.DEAD and ms.expire(9.2) == [ms["node-2"]]
    assert ms.heartbeat("node-1", 101.0) is True  # back from being cut off
    assert ms["node-1"].status is MemberStatus.ALIVE and ms.heartbeat("node-1", 102.0) is False
    with pytest.raises(UnknownNodeError, match="register again"):
        ms.heartbeat("node-9", 102.0)


def test_a_stall_of_the_coordinator_itself_is_not_the_members_silence():
    """Its process did not run for 4 s (a loaded machine): the heartbeats sent meanwhile wait unread in its sockets."""
    ms = Membership(heartbeat_timeout=2.0)
    ms.register(None, A, 0.0)
    ms.register(None, B, 0.0)
    assert ms.expire(0.5) == [] and ms.expire(4.5) == []  # stalled: nobody expires
    ms.heartbeat("node-1", 5.5)  # its heartbeats go on
    assert ms.expire(5.0) == [] and ms.expire(5.9) == []
    assert [m.node_id for m in ms.expire(6.7)] == ["node-2"]  # silent for 2 s after the stall


def test_leaving_and_the_last_node():
    ms = Membership(heartbeat_timeout=5.0)
    ms.register(None, A, 0.0)
    ms.register(None, B, 0.0)
    assert ms.leave("node-1") is True and ms["node-1"].status is MemberStatus.LEAVING
    assert ms.serving("node-1") and [m.node_id for m in ms.alive()] == ["node-2"]
    ms.heartbeat("node-1", 1.0)
    assert ms["node-1"].status is MemberStatus.LEAVING  # a heartbeat does not stop a leave
    ms.left("node-1")
    assert not ms.serving("node-1")
    with pytest.raises(UnknownNodeError):
        ms.heartbeat("node-1", 2.0)
    assert ms.leave("node-2") is False and ms["node-2"].status is MemberStatus.DEAD  # its partitions wait on its disk
    with pytest.raises(UnknownNodeError):
        ms.leave("node-3")


def test_a_leave_whose_partitions_could_not_all_move_ends_dead():
    """The node exits all the same: it must not stay LEAVING (never expired) with partitions nobody serves."""
    ms = Membership(heartbeat_timeout=5.0)
    ms.register(None, A, 0.0)
    ms.register(None, B, 0.0)
    assert ms.leave("node-1") is True
    ms.leave_failed("node-1")
    assert ms["node-1"].status is MemberStatus.DEAD and not ms.serving("node-1")
    assert ms.heartbeat("node-1", 1.0) is True  # a late heartbeat is a return, as after any death


def test_a_drained_member_stays_drained_until_undrained():
    ms = Membership(heartbeat_timeout=5.0)
    for address in (A, B):
        ms.register(None, address, 0.0)
    assert ms.leave("node-2", drain=True) is True and ms["node-2"].status is MemberStatus.LEAVING
    ms.left("node-2")
    assert ms["node-2"].status is MemberStatus.DRAINED and ms.statuses()["node-2"] is MemberStatus.DRAINED
    assert [m.node_id for m in ms.alive()] == ["node-1"] and not ms.serving("node-2")  # no target, holds nothing
    assert ms.heartbeat("node-2", 1.0) is False and ms["node-2"].status is MemberStatus.DRAINED  # heard, not refused
    assert ms.register("node-2", B, 2.0) == ("node-2", False) and ms["node-2"].status is MemberStatus.DRAINED  # its restart
    again = Membership.from_wire(5.0, ms.to_wire(), now=3.0)  # the coordinator's restart
    assert again["node-2"].status is MemberStatus.DRAINED
    assert again.expire(100.0) == [again["node-1"]] and again["node-2"].status is MemberStatus.DRAINED  # never expires
    assert ms.leave("node-2") is False and ms["node-2"].status is MemberStatus.DRAINED  # its own stop moves nothing
    with pytest.raises(MembershipChangeError, match="node-1 is alive, not drained"):
        ms.undrain("node-1", 3.0)
    with pytest.raises(MembershipChangeError, match="silent for 18 s: start its process"):
        ms.undrain("node-2", 20.0)
    ms.heartbeat("node-2", 21.0)
    ms.undrain("node-2", 21.5)
    assert ms["node-2"].status is MemberStatus.ALIVE


def test_a_drain_needs_a_live_node_and_another_to_take_its_partitions_and_may_fail_back_to_alive():
    ms = Membership(heartbeat_timeout=5.0)
    ms.register(None, A, 0.0)
    with pytest.raises(MembershipChangeError, match="only live node"):
        ms.leave("node-1", drain=True)
    assert ms["node-1"].status is MemberStatus.ALIVE
    ms.register(None, B, 0.0)
    ms.expire(3.0)
    ms.heartbeat("node-1", 5.5)
    assert ms.expire(5.5) == [ms["node-2"]]
    with pytest.raises(MembershipChangeError, match="node-2 is dead: only a live node can be drained"):
        ms.leave("node-2", drain=True)
    ms.heartbeat("node-2", 5.6)
    assert ms.leave("node-2", drain=True) is True
    ms.leave_failed("node-2")  # its process still runs and serves what did not move
    assert ms["node-2"].status is MemberStatus.ALIVE and not ms["node-2"].drain


def test_remove_forgets_only_a_member_that_is_gone_and_holds_nothing():
    ms = Membership(heartbeat_timeout=5.0)
    for address in (A, B, "10.0.0.3:7701", "10.0.0.4:7701"):
        ms.register(None, address, 0.0)
    with pytest.raises(MembershipChangeError, match=r"node-1 is alive: drain it first \(rockstate drain node-1\)"):
        ms.remove("node-1", 1.0, [])
    with pytest.raises(UnknownNodeError, match="has no node 'node-9'; its nodes are node-1, node-2, node-3, node-4"):
        ms.remove("node-9", 1.0, [])
    ms.leave("node-2", drain=True)
    ms.left("node-2")
    with pytest.raises(MembershipChangeError, match="drained but its process still runs"):
        ms.remove("node-2", 1.0, [])
    ms.leave("node-2")  # it stops: its own leave
    ms.heartbeat("node-2", 1.4)  # sent as it left, arriving after the leave: it still stopped
    assert ms.remove("node-2", 1.5, []).node_id == "node-2" and "node-2" not in ms.members
    ms.leave("node-3", drain=True)
    ms.left("node-3")
    assert ms.remove("node-3", 6.0, []).status is MemberStatus.DRAINED  # killed: silent for the timeout
    ms.expire(3.0)
    ms.heartbeat("node-1", 5.5)
    assert ms.expire(5.5) == [ms["node-4"]]
    with pytest.raises(MembershipChangeError, match=r"node-4 is dead and still holds 2 partition\(s\) \(3, 5\)") as info:
        ms.remove("node-4", 7.0, [3, 5])
    assert info.value.data["partitions"] == [3, 5]
    ms.remove("node-4", 7.0, [])  # its partitions promoted or restored elsewhere
    assert sorted(ms.members) == ["node-1"]
    assert ms.register(None, A, 8.0) == ("node-5", True)  # ids are never reused


def test_the_members_survive_a_restart_with_a_fresh_timeout():
    ms = Membership(5.0)
    ms.register(None, A, 0.0)
    ms.register(None, B, 0.0)
    ms.expire(10.0)
    ms.register("node-2", B, 11.0)
    saved = ms.to_wire()
    assert saved == {"members": {"node-1": {"address": A, "status": "dead"}, "node-2": {"address": B, "status": "alive"}}, "next_id": 3}
    again = Membership.from_wire(5.0, saved, now=500.0)
    assert again.statuses() == {"node-1": MemberStatus.DEAD, "node-2": MemberStatus.ALIVE}
    assert not again.checked_in_since(500.0) and again.expire(504.0) == []
    again.heartbeat("node-2", 501.0)
    assert again.checked_in_since(500.0)
    assert again.register(None, A, 502.0) == ("node-3", True)


def test_a_silent_member_is_suspect_before_it_is_dead():
    """Suspect after a third of the timeout (at least two of the node's heartbeat intervals), dead after all of it;
    shown, never acted on: its status stays ALIVE until expire()."""
    ms = Membership(heartbeat_timeout=3.0)
    ms.register(None, A, 0.0)
    ms.register(None, B, 0.0)
    m1, m2 = ms["node-1"], ms["node-2"]
    assert ms.suspect_after == 1.0
    assert ms.suspects(0.9) == ([], [])
    ms.heartbeat("node-2", 0.9)
    assert ms.suspects(1.5) == ([], [])  # the caller itself stalled for 0.6 s: nobody becomes suspect then
    assert ms.suspects(1.6) == ([m1], [])
    assert m1.status is MemberStatus.ALIVE and m1.shown == "suspect" and m2.shown == "alive"
    assert ms.alive() == [m1, m2]  # still a target, still serving
    assert ms.suspects(1.7) == ([], [])  # told once
    ms.heartbeat("node-1", 1.8)  # heard again
    ms.heartbeat("node-2", 1.8)
    assert m1.shown == "alive" and ms.suspects(1.9) == ([], [m1])
    assert ms.suspects(2.0) == ([], [])
    ms.heartbeat("node-2", 2.5)
    assert ms.suspects(2.3) == ms.suspects(2.7) == ([], []) and ms.suspects(2.9) == ([m1], [])  # silent again
    assert ms.suspects(3.3) == ([], []) and ms.suspects(3.7) == ([m2], [])
    assert ms.expire(4.7) == [] and ms.expire(4.9) == [m1]
    assert m1.shown == "dead" and not m1.suspect and m2.shown == "suspect"
    assert ms.suspects(5.0) == ([], [])  # the dead one is neither suspect nor recovered
    assert ms.heartbeat("node-1", 5.2) is True  # back from the dead: alive, never "recovered" from a suspicion
    assert m1.shown == "alive" and ms.suspects(5.3) == ([], [])


def test_needs_restart_names_the_heard_members_registered_under_other_settings():
    ms = Membership(heartbeat_timeout=5.0)
    for address in (A, B, "10.0.0.3:7701"):
        ms.register(None, address, 0.0)
    ms["node-1"].settings = {"max_value_bytes": 16, "heartbeat_timeout": 5.0}
    ms["node-2"].settings = {"max_value_bytes": 32, "heartbeat_timeout": 5.0}  # node-3: an older record, not known
    current = {"max_value_bytes": 32, "heartbeat_timeout": 5.0}
    assert ms.needs_restart(current) == {"node-1": ["max_value_bytes"]}
    assert ms.needs_restart({**current, "heartbeat_timeout": 3.0}) == {"node-1": ["heartbeat_timeout", "max_value_bytes"],
                                                                       "node-2": ["heartbeat_timeout"]}
    again = Membership.from_wire(5.0, ms.to_wire(), now=1.0)  # kept with the record
    assert again.needs_restart(current) == {"node-1": ["max_value_bytes"]}
    ms.expire(3.0)
    ms.heartbeat("node-2", 5.5)
    ms.expire(5.5)  # node-1 dead: nothing to restart
    assert ms.needs_restart(current) == {}
