"""The replica planner: replica sets, members' statuses and zones in; target sets and ordered steps out."""

import random
from collections import Counter

import pytest

from rockstate.control.assignment import assign
from rockstate.control.membership import MemberStatus
from rockstate.control.placement import rebalance
from rockstate.control.replica_placement import ReplicaStep, StepKind, plan, under_way

ALIVE, DEAD, LEAVING = MemberStatus.ALIVE, MemberStatus.DEAD, MemberStatus.LEAVING
ADD, PROMOTE, DROP = StepKind.ADD, StepKind.PROMOTE, StepKind.DROP


def members(*ids, status=ALIVE):
    return {f"node-{i}": status for i in ids}


def primaries(target):
    return Counter(r[0] for r in target)


def backups(target):
    return Counter(b for r in target for b in r[1:])


def test_without_backups_the_plan_is_todays_rebalance_move_for_move():
    rng = random.Random(14)
    for _ in range(200):
        n = rng.randint(1, 5)
        statuses = {f"node-{i}": rng.choice([ALIVE, ALIVE, ALIVE, DEAD, LEAVING]) for i in range(1, n + 1)}
        owners = [rng.choice([None, *statuses]) for _ in range(rng.choice([1, 4, 7, 16]))]
        replicas = [[o] if o else [] for o in owners]
        p = plan(replicas, statuses, backup_count=0)
        assert p.moves(replicas) == rebalance(owners, statuses)
        assert all(len(r) <= 1 for r in p.target)
        alive = [m for m, s in statuses.items() if s is ALIVE]
        if alive and all(o is None or statuses[o] is not DEAD for o in owners):
            assert [r[0] for r in p.target] == assign(owners, alive)
        for move in p.moves(replicas):  # each move: add the new owner, promote it, drop the old one
            expected = [ReplicaStep(move.partition, ADD, move.target), ReplicaStep(move.partition, PROMOTE, move.target)]
            expected += [ReplicaStep(move.partition, DROP, move.source)] if move.source else []
            assert [s for s in p.steps if s.partition == move.partition] == expected


def test_a_new_cluster_gets_balanced_primaries_and_backups_on_distinct_nodes():
    p = plan([[]] * 12, members(1, 2, 3), backup_count=1)
    assert all(len(r) == 2 and r[0] != r[1] for r in p.target)
    assert primaries(p.target) == backups(p.target) == {"node-1": 4, "node-2": 4, "node-3": 4}
    assert not p.missing
    assert {s.kind for s in p.steps} == {ADD, PROMOTE}  # nothing to drop


def test_a_join_changes_only_the_new_members_share():
    before = plan([[]] * 12, members(1, 2, 3), backup_count=1).target
    p = plan(before, members(1, 2, 3, 4), backup_count=1)
    assert primaries(p.target) == backups(p.target) == {f"node-{i}": 3 for i in range(1, 5)}
    adds = [s for s in p.steps if s.kind is ADD]
    assert {s.node for s in adds} == {"node-4"} and len(adds) == 3 + 3  # its primaries and its backups
    assert len([s for s in p.steps if s.kind is DROP]) == len(adds)
    assert plan(p.target, members(1, 2, 3, 4), backup_count=1).steps == []  # stable once reached


def test_a_join_planned_again_half_way_keeps_to_the_first_plan_and_copies_only_the_new_members_share():
    """A coordinator plans each round from the sets as they are. Half-way through a join (handovers under way, new
    backups beside the ones they replace), a plan of the sets as they stand put backups elsewhere that the next
    plan took back: 690 copies in a P=1024 join where 512 do. ``under_way`` plans from where the changes lead."""
    three, four = members(1, 2, 3), members(1, 2, 3, 4)
    before = plan([[]] * 1024, three, backup_count=1).target
    first = plan(before, four, backup_count=1)
    moves = {m.partition: (m.source, m.target) for m in first.moves(before)}
    assert len(moves) == 256
    # half-way: each handover's target added as a replica, each other new backup added beside the one it replaces
    sets = [list(r) for r in before]
    intended = {}
    for pid, (source, target) in moves.items():
        sets[pid] = [source, *before[pid][1:], target]
    for step in first.steps:
        if step.kind is ADD and step.partition not in moves:
            sets[step.partition].append(step.node)
            intended[step.partition] = first.target[step.partition]
    assert len(intended) == 256
    as_they_stand = plan(sets, four, backup_count=1)
    assert {s.node for s in as_they_stand.steps if s.kind is ADD} != {"node-4"}  # the waste this avoids
    view, due, going = under_way(sets, moves, intended)
    again = plan(view, four, backup_count=1)
    assert again.steps == [] and view == first.target  # nothing new: the first plan stands
    assert going == intended and due == {pid: [n for n in sets[pid] if n not in first.target[pid]] for pid in intended}
    assert all(len(nodes) == 1 and nodes[0] != "node-4" for nodes in due.values())
    # once a partition's drop is done (or its replica is gone, or its primary changed), it is no longer under way
    done = dict(intended)
    pid = next(iter(done))
    sets[pid] = list(first.target[pid])
    other = next(p for p in done if p != pid)
    sets[other] = sets[other][:2]  # its new backup gone (a failed copy): the old one stays
    _, due, going = under_way(sets, {}, done)
    assert pid not in going and other not in going and len(going) == len(done) - 2


def test_a_leave_moves_the_leaving_members_replicas_and_no_others():
    before = plan([[]] * 12, members(1, 2, 3, 4), backup_count=1).target
    held = sum(1 for r in before for n in r if n == "node-2")
    p = plan(before, {**members(1, 3, 4), "node-2": LEAVING}, backup_count=1)
    assert all("node-2" not in r and len(set(r)) == 2 for r in p.target)
    assert primaries(p.target) == backups(p.target) == {"node-1": 4, "node-3": 4, "node-4": 4}
    assert len([s for s in p.steps if s.kind is ADD]) == held
    assert {s.node for s in p.steps if s.kind is DROP} == {"node-2"}


def test_steps_add_before_they_drop_so_no_partition_has_fewer_in_sync_replicas():
    rng = random.Random(7)
    for _ in range(100):
        b = rng.choice([1, 2])
        before = plan([[]] * rng.choice([6, 12, 30]), members(*range(1, 5)), backup_count=b).target
        after = {**members(*range(1, 7)), f"node-{rng.randint(1, 4)}": LEAVING}
        p = plan(before, after, backup_count=b)
        for pid, old in enumerate(before):
            replicas = set(old)
            for step in (s for s in p.steps if s.partition == pid):
                if step.kind is ADD:
                    replicas.add(step.node)  # a step begins when the one before is done: this one in sync
                elif step.kind is PROMOTE:
                    assert step.node in replicas
                else:
                    replicas.discard(step.node)
                assert len(replicas) >= min(len(old), len(p.target[pid]))
            assert replicas == set(p.target[pid])


def test_replicas_are_in_distinct_zones_when_there_are_enough_zones():
    zones = {"node-1": "eu-1a", "node-2": "eu-1a", "node-3": "eu-1b", "node-4": "eu-1b", "node-5": "eu-1c"}
    p = plan([[]] * 30, members(1, 2, 3, 4, 5), backup_count=1, zones=zones)
    assert all(zones[r[0]] != zones[r[1]] for r in p.target)
    p = plan([[]] * 30, members(1, 2, 3, 4, 5), backup_count=2, zones=zones)
    assert all(len({zones[n] for n in r}) == 3 for r in p.target)
    assert primaries(p.target) == {f"node-{i}": 6 for i in range(1, 6)}
    # with too few zones: distinct members, and both zones used
    two = {"node-1": "a", "node-2": "a", "node-3": "b", "node-4": "b"}
    p = plan([[]] * 12, members(1, 2, 3, 4), backup_count=2, zones=two)
    assert all(len(set(r)) == 3 and len({two[n] for n in r}) == 2 for r in p.target)


def test_zone_violations_of_the_current_table_are_repaired():
    zones = {"node-1": "a", "node-2": "a", "node-3": "b"}
    p = plan([["node-1", "node-2"], ["node-3", "node-1"]], members(1, 2, 3), backup_count=1, zones=zones)
    assert zones[p.target[0][0]] != zones[p.target[0][1]]
    assert p.target[1] == ["node-3", "node-1"]  # already fine: untouched


def _peers(target):
    """Each primary's backup members, over all its partitions."""
    peers = {}
    for r in target:
        peers.setdefault(r[0], set()).update(r[1:])
    return peers


def _successors(node, ids, count, zones=None):
    """The ``count`` members after ``node`` in id order (of other zones, with ``zones``)."""
    ring = sorted(ids)
    at = ring.index(node)
    after = [ring[(at + k) % len(ring)] for k in range(1, len(ring))]
    return [n for n in after if zones is None or zones[n] != zones[node]][:count]


@pytest.mark.parametrize("nodes, partitions, backup_count", [(16, 1024, 1), (16, 271, 1), (8, 1024, 2), (24, 512, 1)])
def test_a_primarys_backups_go_to_its_successors_so_it_replicates_to_few_members(nodes, partitions, backup_count, monkeypatch):
    """A new cluster: each primary's partitions back up to its next ``backup_count + 1`` members (a few partitions
    excepted), where a plan without the swaps spread them over every member; loads and steps are those of the plan
    without the swaps."""
    ids = [f"node-{i:02d}" for i in range(nodes)]
    status = dict.fromkeys(ids, ALIVE)
    p = plan([[]] * partitions, status, backup_count=backup_count)
    on_successors = sum(b in _successors(r[0], ids, backup_count + 1) for r in p.target for b in r[1:])
    assert on_successors >= 0.95 * partitions * backup_count
    peers = _peers(p.target)
    assert sorted(len(v) for v in peers.values())[len(peers) // 2] == backup_count + 1  # the median primary's
    assert all(len(set(r)) == backup_count + 1 for r in p.target)
    monkeypatch.setattr("rockstate.control.replica_placement._Backups.scatter", lambda *a: None)
    spread = plan([[]] * partitions, status, backup_count=backup_count)
    assert max(len(v) for v in _peers(spread.target).values()) > 2 * (backup_count + 1)  # what the swaps undo
    assert backups(p.target) == backups(spread.target) and primaries(p.target) == primaries(spread.target)
    assert len(p.steps) == len(spread.steps)


def test_successors_are_of_other_zones_and_a_death_promotes_on_them():
    """With strict zones, a primary's successors skip its own zone; a dead member's partitions are promoted on its
    successors (the backups a plan adds go there, every rule kept)."""
    ids = [f"node-{i:02d}" for i in range(12)]
    zones = {n: "abc"[i % 3] for i, n in enumerate(ids)}
    status = dict.fromkeys(ids, ALIVE)
    p = plan([[]] * 288, status, backup_count=1, zones=zones)
    assert all(zones[r[0]] != zones[r[1]] for r in p.target)
    assert sum(r[1] in _successors(r[0], ids, 2, zones) for r in p.target) >= 0.95 * 288
    dead = "node-05"
    after = plan(p.target, {**status, dead: DEAD}, backup_count=1, zones=zones)
    promoted_on = Counter(r[1] for r in p.target if r[0] == dead)  # its partitions' backups: promoted on its death
    assert len(promoted_on) <= 3 and sum(promoted_on[n] for n in _successors(dead, ids, 2, zones)) >= 0.9 * 24
    assert all(dead not in r[1:] and zones[r[0]] != zones[r[1]] for r in after.target if r[0] != dead)


def test_too_few_members_leaves_partitions_short_of_backups():
    p = plan([[]] * 4, members(1, 2), backup_count=2)
    assert all(len(r) == 2 for r in p.target)
    assert p.missing == {0: 1, 1: 1, 2: 1, 3: 1}


def test_a_dead_primarys_partitions_wait_for_promotion_and_dead_backups_are_replaced():
    before = [["node-1", "node-2"], ["node-2", "node-3"], ["node-3", "node-1"]]
    p = plan(before, {**members(2, 3, 4), "node-1": DEAD}, backup_count=1)
    assert p.target[0] == ["node-1", "node-2"]  # InSyncSets promotes node-2 first
    assert p.target[2][0] == "node-3" and p.target[2][1] in ("node-2", "node-4")
    assert not any(s.partition == 0 for s in p.steps)
    assert plan(before, members(1, status=DEAD), backup_count=1).target == before  # nobody alive: nothing
