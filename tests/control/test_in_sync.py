"""The coordinator's in-sync sets, driven by hand: planned steps, the primary's reports and deaths in, actions out."""

from rockstate.control.in_sync import AskPositions, CatchUp, InSyncSets, Promoted, Publish, RestoreFromCheckpoint
from rockstate.control.membership import MemberStatus
from rockstate.control.replica_placement import StepKind, handover_adds, plan

ALIVE, LEAVING = MemberStatus.ALIVE, MemberStatus.LEAVING


def test_a_new_backup_catches_up_then_joins_the_in_sync_set():
    sets = InSyncSets(1, [["node-1"]])
    assert sets.add_backup(0, "node-2") == [Publish(0, 2, "node-1", ("node-2",), ("node-1",)), CatchUp(0, "node-2", "node-1")]
    assert sets.caught_up(0, "node-2", epoch=1) == []  # reported at an older epoch: ignored
    assert sets.caught_up(0, "node-2", epoch=2) == [Publish(0, 3, "node-1", ("node-2",), ("node-1", "node-2"))]
    assert sets.caught_up(0, "node-2", epoch=3) == []  # in sync already
    assert sets.add_backup(0, "node-2") == [] and sets.add_backup(0, "node-1") == []


def test_an_unreachable_backup_leaves_the_in_sync_set_with_an_epoch_bump():
    sets = InSyncSets(1, [["node-1", "node-2"]])
    assert sets.unreachable(0, "node-2", epoch=0) == []  # a deposed primary's report changes nothing
    actions = sets.unreachable(0, "node-2", epoch=1)
    assert actions == [Publish(0, 2, "node-1", ("node-2",), ("node-1",)), CatchUp(0, "node-2", "node-1")]
    assert sets.unreachable(0, "node-2", epoch=2) == []
    assert sets.caught_up(0, "node-2", epoch=2)[0].in_sync == ("node-1", "node-2")


def test_a_handover_promotes_a_backup_of_the_source_and_the_old_primary_leaves_the_set():
    sets = InSyncSets(1, [["node-1", "node-3"]])
    sets.add_backup(0, "node-2")  # the target, an extra replica
    sets.caught_up(0, "node-2", epoch=2)
    assert len(sets[0].in_sync) == 3
    assert sets.promote(0, "node-2", source="node-4") == []  # not the primary: changed meanwhile
    assert sets.promote(0, "node-5", source="node-1") == []  # no backup of it
    assert sets.promote(0, "node-2", source="node-1") == [Publish(0, 4, "node-2", ("node-3",), ("node-2", "node-3"))]
    assert sets.table() == [["node-2", "node-3"]]


def test_a_handover_may_promote_a_confirmed_backup_a_late_report_took_out_of_the_set():
    sets = InSyncSets(1, [["node-1", "node-2"]])
    sets.unreachable(0, "node-2", epoch=1)  # raced with the drain; the caller confirmed its position since
    assert sets.promote(0, "node-2", source="node-1") == [Publish(0, 3, "node-2", (), ("node-2",))]


def test_a_backup_out_of_sync_when_its_primary_hands_over_copies_from_the_new_primary_at_once():
    sets = InSyncSets(2, [["node-1", "node-2", "node-3"]])
    sets.unreachable(0, "node-3", epoch=1)
    assert sets.promote(0, "node-2", source="node-1") == [Publish(0, 3, "node-2", ("node-3",), ("node-2",)),
                                                           CatchUp(0, "node-3", "node-2")]


def test_a_drop_waits_while_its_replacement_catches_up():
    sets = InSyncSets(1, [["node-1", "node-2"]])
    sets.add_backup(0, "node-3")
    assert sets.drop(0, "node-2") is None  # it would leave one in-sync replica of the two configured
    sets.caught_up(0, "node-3", epoch=2)
    assert sets.drop(0, "node-2") == [Publish(0, 4, "node-1", ("node-3",), ("node-1", "node-3"))]
    assert sets.drop(0, "node-2") == []


def test_a_dead_primary_is_replaced_by_the_most_advanced_in_sync_backup():
    sets = InSyncSets(2, [["node-1", "node-2", "node-3", "node-4"]])
    sets.unreachable(0, "node-4", epoch=1)  # out of sync: lacks acknowledged writes
    actions = sets.members_dead(["node-1"])
    assert actions == [Publish(0, 3, None, ("node-2", "node-3"), ("node-2", "node-3")), AskPositions(0, ("node-2", "node-3"))]
    assert sets.positions(0, {}, now=0.0) == []  # no answer yet: nothing
    assert sets.positions(0, {"node-2": 41, "node-3": 42}, now=0.0) == [
        Publish(0, 4, "node-3", ("node-2",), ("node-2", "node-3")), Promoted(0, "node-1", "node-3", 4)]
    assert sets.positions(0, {"node-2": 50}, now=0.0) == []  # decided already
    assert sets.table() == [["node-3", "node-2"]]


def test_an_election_picks_among_those_that_answered_balancing_primaries_on_ties():
    sets = InSyncSets(1, [["node-1", "node-2", "node-3"], ["node-2", "node-1"]])
    sets.members_dead(["node-1"])
    assert sets.positions(0, {"node-2": 9, "node-3": 9}, now=0.0)[-1] == Promoted(0, "node-1", "node-3", 3)  # node-2 leads one
    sets = InSyncSets(1, [["node-1", "node-2", "node-3"]])
    sets.members_dead(["node-1"])
    assert sets.positions(0, {"node-2": 3}, now=0.0)[0] == Publish(0, 3, "node-2", (), ("node-2",))  # node-3 is re-added later


def test_simultaneous_deaths_up_to_backup_count_keep_the_partition():
    sets = InSyncSets(2, [["node-1", "node-2", "node-3"], ["node-3", "node-1", "node-2"]])
    actions = sets.members_dead(["node-1", "node-2"])
    assert AskPositions(0, ("node-3",)) in actions
    assert actions[-1] == Publish(1, 2, "node-3", (), ("node-3",))  # a primary that lost its backups serves on
    assert sets.positions(0, {"node-3": 7}, now=0.0)[-1] == Promoted(0, "node-1", "node-3", 3)


def test_with_no_in_sync_replica_left_the_partition_is_restored_from_the_checkpoint():
    sets = InSyncSets(1, [["node-1", "node-2"], ["node-2", "node-1"]])
    sets.unreachable(1, "node-1", epoch=1)
    actions = sets.members_dead(["node-2"])
    assert RestoreFromCheckpoint(1, "node-2") in actions  # node-1 lacks acknowledged writes
    assert sets.table()[1] == ["node-2"]  # the planner leaves it to the restore
    assert sets[1].replicas() == [] and sets.restored(1, "node-3") == [Publish(1, 4, "node-3", (), ("node-3",))]
    assert sets.restored(1, "node-1") == []


def test_an_election_whose_last_candidate_dies_falls_back_to_the_checkpoint():
    sets = InSyncSets(1, [["node-1", "node-2"]])
    assert sets.members_dead(["node-1"])[-1] == AskPositions(0, ("node-2",))
    assert sets.members_dead(["node-2"]) == [Publish(0, 3, None, (), ()), RestoreFromCheckpoint(0, "node-1")]
    assert sets.positions(0, {"node-2": 5}, now=0.0) == []  # a late answer from the dead changes nothing


def test_a_candidate_that_answers_without_a_copy_is_no_candidate():
    sets = InSyncSets(2, [["node-1", "node-2", "node-3"]])
    sets.members_dead(["node-1"])
    assert sets.positions(0, {"node-2": None}, now=0.0) == [Publish(0, 3, None, ("node-3",), ("node-3",))]
    assert sets.positions(0, {"node-3": 4}, now=1.0)[-1] == Promoted(0, "node-1", "node-3", 4)
    sets = InSyncSets(1, [["node-1", "node-2"]])
    sets.members_dead(["node-1"])
    assert sets.positions(0, {"node-2": None}, now=0.0) == [
        Publish(0, 3, None, (), ()), RestoreFromCheckpoint(0, "node-1", "its in-sync backups ['node-2'] hold no copy")]
    assert sets.lost() == {0: "node-1"} and sets.positions(0, {"node-2": 9}, now=1.0) == []  # left to the restore


def test_an_election_no_candidate_answers_falls_to_the_checkpoint_after_its_timeout():
    sets = InSyncSets(1, [["node-1", "node-2"]], election_timeout=20.0)
    sets.members_dead(["node-1"])
    assert sets.positions(0, {}, now=100.0) == []  # the first ask starts the clock
    assert sets.positions(0, {}, now=119.0) == []
    assert sets.positions(0, {}, now=121.0) == [
        Publish(0, 3, None, (), ()), RestoreFromCheckpoint(0, "node-1", "no in-sync backup of ['node-2'] answered within 20s")]
    assert sets.restored(0, "node-3") == [Publish(0, 4, "node-3", (), ("node-3",))]


def test_a_backup_copying_anew_is_not_counted_in_sync_by_a_late_report():
    """A late ``caught_up`` of its previous copy, which it is dropping, is refused; the epoch bumps all the same so
    the primary stops waiting for it; once the copy is done its next report counts."""
    sets = InSyncSets(1, [["node-1"]])
    sets.add_backup(0, "node-2")
    assert sets.copy_started(0, "node-2") and not sets.copy_started(0, "node-2")  # one at a time
    assert sets.caught_up(0, "node-2", epoch=2) == [Publish(0, 3, "node-1", ("node-2",), ("node-1",))]
    sets.copy_finished(0, "node-2")
    assert sets.caught_up(0, "node-2", epoch=3) == [Publish(0, 4, "node-1", ("node-2",), ("node-1", "node-2"))]
    assert not sets.copy_started(0, "node-2")  # in sync: no copy
    sets.unreachable(0, "node-2", epoch=4)
    assert sets.copy_started(0, "node-2")
    sets.members_dead(["node-2"])
    assert sets.copying == set()


def carry_out_plans(sets: InSyncSets, statuses: dict, backup_count: int) -> int:
    """Plan and carry out the steps as the coordinator does: a primary by a handover (``handover_adds`` added and
    caught up, then the target promoted; its partition's other steps left to the next plan), drops tried while the
    added replicas still catch up; plan again until nothing is left. After every step each partition has at least
    as many in-sync replicas as configured. Answers the rounds."""
    def check() -> None:
        assert all(len(s.in_sync) >= backup_count + 1 for s in sets.sets), sets.sets

    for rounds in range(1, 10):
        steps = plan(sets.table(), statuses, backup_count=backup_count).steps
        if not steps:
            return rounds
        moving = {st.partition: st.node for st in steps if st.kind is StepKind.PROMOTE}  # the rest: planned anew after
        adds = [(st.partition, st.node) for st in steps if st.kind is StepKind.ADD and st.partition not in moving]
        for pid, target in moving.items():
            adds += [(pid, n) for n in handover_adds(sets.table(), pid, sets[pid].primary, target, sets[pid].in_sync,
                                                    statuses, backup_count)]
        for pid, node in adds:
            assert sets.add_backup(pid, node)[1] == CatchUp(pid, node, sets[pid].primary)
        refused = [st for st in steps if st.kind is StepKind.DROP and st.partition not in moving
                   and sets.drop(st.partition, st.node) is None]
        assert refused or not adds  # a replica still catching up holds back the drop of an in-sync one
        check()
        for pid, node in adds:
            sets.caught_up(pid, node, sets[pid].epoch)
        for step in (st for st in steps if st.kind is StepKind.PROMOTE):
            s = sets[step.partition]
            assert step.node in s.in_sync  # added and caught up first
            assert sets.promote(step.partition, step.node, source=s.primary)
            check()
        for step in refused:
            assert sets.drop(step.partition, step.node) is not None
            check()
    raise AssertionError("the plans did not converge")


def test_the_planners_steps_carried_out_reach_its_target_without_losing_in_sync_replicas():
    table = plan([[]] * 12, {f"node-{i}": ALIVE for i in (1, 2, 3)}, backup_count=1).target
    sets = InSyncSets(1, table)
    statuses = {"node-1": ALIVE, "node-2": LEAVING, "node-3": ALIVE, "node-4": ALIVE}
    carry_out_plans(sets, statuses, backup_count=1)
    target = plan(sets.table(), statuses, backup_count=1).target
    assert sets.table() == target and not any("node-2" in r for r in target)


def test_a_join_and_a_leave_with_two_backups_never_lose_an_in_sync_replica():
    nodes = [f"node-{i}" for i in range(1, 5)]
    sets = InSyncSets(2, plan([[]] * 16, dict.fromkeys(nodes, ALIVE), backup_count=2).target)
    joined = {**dict.fromkeys(nodes, ALIVE), "node-5": ALIVE}
    carry_out_plans(sets, joined, backup_count=2)
    assert sum(r[0] == "node-5" for r in sets.table()) >= 3  # it got its share of primaries
    carry_out_plans(sets, {**joined, "node-1": LEAVING}, backup_count=2)
    assert not any("node-1" in r for r in sets.table())


def test_after_a_promotion_the_planner_restores_the_backup_count():
    sets = InSyncSets(1, plan([[]] * 6, {f"node-{i}": ALIVE for i in (1, 2, 3)}, backup_count=1).target)
    statuses = {"node-1": MemberStatus.DEAD, "node-2": ALIVE, "node-3": ALIVE}
    asks = [a for a in sets.members_dead(["node-1"]) if isinstance(a, AskPositions)]
    assert [a.partition for a in asks] == [0, 1]  # node-1 led these
    assert sets.table()[:2] == [["node-1", "node-2"], ["node-1", "node-3"]]  # named by their dead primary
    assert not any(s.partition in (0, 1) for s in plan(sets.table(), statuses, backup_count=1).steps)  # left to the election
    for ask in asks:
        sets.positions(ask.partition, {n: 3 for n in ask.nodes}, now=0.0)
    after = plan(sets.table(), statuses, backup_count=1)
    assert all(len(r) == 2 and "node-1" not in r for r in after.target)
    assert {s.kind for s in after.steps} <= {StepKind.ADD, StepKind.PROMOTE, StepKind.DROP}
    assert all(step.node != "node-1" for step in after.steps if step.kind is StepKind.ADD)


def test_a_primary_changed_by_a_copy_makes_its_backups_catch_up_anew():
    sets = InSyncSets(1, [["node-1", "node-2", "node-3"]])
    assert sets.moved(0, "node-3") == [Publish(0, 2, "node-3", ("node-2",), ("node-3",)), CatchUp(0, "node-2", "node-3")]
    fresh = InSyncSets(1, [[]])  # a partition's first owner
    assert fresh.moved(0, "node-1") == [Publish(0, 2, "node-1", (), ("node-1",))]


def test_a_backup_about_to_receive_the_partition_as_primary_leaves_first():
    sets = InSyncSets(1, [["node-1", "node-2"]])
    assert sets.leave(0, "node-2") == [Publish(0, 2, "node-1", (), ("node-1",))]
    assert sets.leave(0, "node-2") == []


def test_a_dead_primary_back_before_an_election_takes_its_partitions_back():
    sets = InSyncSets(1, [["node-1", "node-2"], ["node-1"]])
    actions = sets.members_dead(["node-1"])
    assert [type(a) for a in actions] == [Publish, AskPositions, Publish, RestoreFromCheckpoint]
    assert set(sets.lost()) == {0, 1}
    back = sets.returned("node-1")  # no backup answered yet: its copy is the most advanced
    assert [type(a) for a in back] == [Publish, CatchUp, Publish] and not sets.lost()
    assert sets[0].primary == "node-1" and sets[0].in_sync == {"node-1"} and sets[0].backups == ["node-2"]
    assert sets.positions(0, {"node-2": 7}, now=0.0) == []  # the election is over


def test_the_sets_survive_a_round_trip_through_the_saved_record():
    sets = InSyncSets(1, [["node-1", "node-2"], ["node-2", "node-1"]])
    sets.members_dead(["node-1"])
    again = InSyncSets.from_wire(1, sets.to_wire())
    assert again.table() == sets.table() and again.lost() == sets.lost()
    assert [(s.primary, s.backups, s.in_sync, s.epoch) for s in again.sets] == [
        (s.primary, s.backups, s.in_sync, s.epoch) for s in sets.sets]


def test_a_handover_to_its_own_backup_first_adds_one_so_the_old_primarys_departure_leaves_enough_in_sync():
    statuses = {"node-1": LEAVING, "node-2": ALIVE, "node-3": ALIVE, "node-4": ALIVE}
    replicas = [["node-1", "node-2"], ["node-3", "node-4"], ["node-4", "node-3"]]
    assert handover_adds(replicas, 0, "node-1", "node-2", {"node-1", "node-2"}, statuses, 1) == ["node-3"]  # least loaded
    assert handover_adds(replicas, 0, "node-1", "node-3", {"node-1", "node-2"}, statuses, 1) == ["node-3"]  # the target
    assert handover_adds(replicas, 0, "node-1", "node-2", {"node-1"}, statuses, 1) == ["node-3"]  # node-2 out of sync
    two = {"node-1": LEAVING, "node-2": ALIVE}
    assert handover_adds([["node-1", "node-2"]], 0, "node-1", "node-2", {"node-1", "node-2"}, two, 1) == []  # none left
    # a round of handovers passes one count of the replicas each node holds; the tie-break follows it, not the table
    held = {"node-1": 1, "node-2": 1, "node-3": 5, "node-4": 2}
    assert handover_adds(replicas, 0, "node-1", "node-2", {"node-1", "node-2"}, statuses, 1, wanted=lambda: ["node-2", "node-1"],
                         held=lambda: held) == ["node-4"]  # neither free node planned: the fewer held
    assert handover_adds(replicas, 0, "node-1", "node-2", {"node-1", "node-2"}, statuses, 1, wanted=lambda: ["node-2", "node-3"],
                         held=lambda: held) == ["node-3"]  # the plan's first


def test_a_handovers_replicas_are_not_dropped_until_it_ends():
    """The planner sees an extra backup while a handover's target catches up; dropping it failed the handover (chaos
    seed 3: partition 22's handover lost its target so, its other backup was out of sync, and the primary's death
    then restored the partition from a checkpoint)."""
    sets = InSyncSets(1, [["node-3", "node-1"]])
    sets.unreachable(0, "node-1", epoch=1)  # a restarted node's backup, out of sync
    sets.reserve(0, {"node-4"})
    sets.add_backup(0, "node-4")  # the handover's target
    assert sets.drop(0, "node-4") is None and sets[0].backups == ["node-1", "node-4"]
    sets.release(0)
    assert sets.drop(0, "node-4") == [Publish(0, 4, "node-3", ("node-1",), ("node-3",))]


def test_a_backup_without_a_copy_copies_at_once_in_the_set_or_out_of_it():
    """A restarted node holds no open backup copy: the stream cannot bring it back, a copy must, whatever the set
    says of it (it was reported unreachable first when its primary's sends timed out)."""
    sets = InSyncSets(1, [["node-3", "node-1"], ["node-3", "node-1"]])
    assert sets.diverged(0, "node-1", epoch=1) == [Publish(0, 2, "node-3", ("node-1",), ("node-3",)), CatchUp(0, "node-1", "node-3")]
    sets.unreachable(1, "node-1", epoch=1)
    assert sets.diverged(1, "node-1", epoch=2) == [CatchUp(1, "node-1", "node-3")]
    assert sets.diverged(1, "node-1", epoch=1) == [] and sets.diverged(1, "node-2", epoch=2) == []  # stale, or no backup
