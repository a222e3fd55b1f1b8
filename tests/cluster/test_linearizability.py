"""Linearizability: the checker on hand-made histories, compare-and-set, and recorded histories of
random single-key reads, writes and compare-and-sets on multi-process clusters during migrations and a
failover (where the only anomaly allowed is the documented loss)."""

from __future__ import annotations

import asyncio
import functools
import math
import random
import threading
from typing import ContextManager

import pytest

import rockstate
from rockstate import keys as keyhash
from rockstate.local.cluster import LocalCluster, wait_until
from rockstate.testing.history import CAS, READ, UNKNOWN, WRITE, History, Operation, Restore, check_history
from rockstate.testing.workload import Workload, keys_for
from rockstate.testing.cluster import gen_cluster, local_cluster

# -- the checker on hand-made histories --------------------------------------------


def op(i, process, kind, value=None, output=None, call=0.0, ret=1.0, key="k"):
    """An operation; ``ret=None`` makes it indeterminate (info)."""
    known = ret is not None
    return Operation(i, process, kind, key, value, output if known else UNKNOWN, call, ret if known else math.inf,
                     "ok" if known else "info")


def violations(ops, **kw):
    return check_history(ops, **kw).violations


def test_sequential_and_concurrent_histories_are_linearizable():
    assert not violations([op(0, 1, WRITE, "a"), op(1, 2, READ, output="a", call=2, ret=3)])
    # a read concurrent with a write may see either value, but never the old one after the new one
    assert not violations([op(0, 1, WRITE, "a", call=0, ret=10), op(1, 2, READ, output=None, call=1, ret=2),
                           op(2, 3, READ, output="a", call=3, ret=4)])
    assert len(violations([op(0, 1, WRITE, "a", call=0, ret=10), op(1, 2, READ, output="a", call=1, ret=2),
                           op(2, 3, READ, output=None, call=3, ret=4)])) == 1
    assert not violations([op(0, 1, READ, output=None), op(1, 2, CAS, (None, 1), True, 2, 3),
                           op(2, 1, CAS, (None, 2), False, 4, 5), op(3, 2, READ, output=1, call=6, ret=7)])
    assert check_history([]).ok


def test_stale_read_is_a_violation():
    ops = [op(0, 1, WRITE, "a", call=0, ret=1), op(1, 2, WRITE, "b", call=2, ret=3), op(2, 3, READ, output="a", call=4, ret=5)]
    [v] = violations(ops)
    assert v.key == "k" and v.operation.id == 2 and v.value == "b"
    assert "no order can place" in str(v)


def test_lost_update_is_a_violation():
    """Two clients read 0, both compare-and-set from 0, both succeed: one update is lost."""
    ops = [op(0, 1, READ, output=0), op(1, 2, READ, output=0),
           op(2, 1, CAS, (0, 1), True, 2, 3), op(3, 2, CAS, (0, 2), True, 2, 3)]
    assert len(violations(ops, initial=0)) == 1
    # the same with two plain writes is fine: a write needs no read
    assert not violations([op(0, 1, WRITE, 1, call=2, ret=3), op(1, 2, WRITE, 2, call=2, ret=3)], initial=0)


def test_a_failed_compare_and_set_must_have_seen_another_value():
    assert len(violations([op(0, 1, CAS, (None, 1), False)])) == 1
    assert not violations([op(0, 1, WRITE, 5), op(1, 2, CAS, (None, 1), False, 2, 3)])


def test_indeterminate_operations_may_or_may_not_have_happened():
    write = op(0, 1, WRITE, "a", ret=None)
    assert not violations([write, op(1, 2, READ, output="a", call=5, ret=6)])
    assert not violations([write, op(1, 2, READ, output=None, call=5, ret=6)])
    # but once seen, it stays: it happened at one instant
    assert len(violations([write, op(1, 2, READ, output="a", call=5, ret=6), op(2, 2, READ, output=None, call=7, ret=8)])) == 1
    # never before its invocation
    assert len(violations([op(0, 1, READ, output="a", call=0, ret=1), op(1, 2, WRITE, "a", call=2, ret=None)])) == 1
    cas = op(0, 1, CAS, (None, 1), ret=None)
    assert not violations([cas, op(1, 2, READ, output=1, call=5, ret=6)])


def test_history_records_threads_and_drops_failed_operations():
    h = History()
    a = h.invoke(1, WRITE, "k", "a")
    with pytest.raises(ValueError, match="still has operation"):
        h.invoke(1, READ, "k")
    h.fail(a, "refused")  # certainly not applied: left out
    b = h.invoke(1, WRITE, "k", "b")
    h.info(b, "reply lost")
    c = h.invoke(2, READ, "k")
    h.ok(c, "b")
    h.invoke(3, CAS, "k", (["x"], "y"))  # still open: indeterminate
    ops = h.operations()
    assert [(o.kind, o.status) for o in ops] == [(WRITE, "info"), (READ, "ok"), (CAS, "info")]
    assert ops[0].ret == math.inf and ops[1].output == "b" and ops[2].value == (("x",), "y")
    assert [e.type for e in h.events] == ["invoke", "fail", "invoke", "info", "invoke", "ok", "invoke"]
    assert check_history(h).ok
    h2 = History()
    h2.ok(h2.invoke(1, READ, "k"), "a")  # a value nobody wrote
    assert not check_history(h2).ok


def test_keys_are_checked_independently():
    ops = [op(0, 1, WRITE, 1, key="x"), op(1, 2, READ, output=1, call=2, ret=3, key="y"),
           op(2, 2, READ, output=1, call=2, ret=3, key="x")]
    report = check_history(ops)
    assert [v.key for v in report.violations] == ["y"] and report.keys == 2 and report.operations == 3


# failover: checkpoint window (2, 3), owner killed in (6, 7), restored copy served by 9
FAILOVER = dict(died=(6.0, 7.0), restored=9.0, checkpoint=(2.0, 3.0), checkpoint_id=1)


def failover_check(ops, **restore):
    return check_history(ops, restores=[Restore(0, **{**FAILOVER, **restore})], partition_of=lambda key: 0)


def test_writes_after_the_checkpoint_lost_in_a_failover_are_the_documented_loss():
    kept, lost = op(0, 1, WRITE, 1, call=0, ret=1), op(1, 1, WRITE, 2, call=4, ret=5)
    after = op(2, 2, READ, output=1, call=10, ret=11)
    assert len(check_history([kept, lost, after]).violations) == 1  # as a plain register: a stale read
    report = failover_check([kept, lost, after])
    assert report.ok and [d.lost for d in report.documented_loss] == [[lost]]
    assert "1 acknowledged write(s) lost" in str(report)
    # a write concurrent with the checkpoint may be in it or not
    during = op(1, 1, WRITE, 2, call=1.5, ret=2.5)
    assert failover_check([kept, during, op(2, 2, READ, output=2, call=10, ret=11)]).ok
    assert failover_check([kept, during, op(2, 2, READ, output=1, call=10, ret=11)]).ok
    # the checkpoint's contents instead of its window
    report = failover_check([kept, lost, after], checkpoint=None, contents={"k": 1})
    assert report.ok and [d.lost for d in report.documented_loss] == [[lost]]


def test_what_a_failover_does_not_explain_stays_a_violation():
    kept = op(0, 1, WRITE, 1, call=0, ret=1)
    # a write completed before the checkpoint started must survive
    assert len(failover_check([kept, op(1, 2, READ, output=None, call=10, ret=11)]).violations) == 1
    # a write acknowledged after the owner died (by the new owner) must survive
    late = op(1, 1, WRITE, 3, call=7.5, ret=8.5)
    assert len(failover_check([kept, late, op(2, 2, READ, output=1, call=10, ret=11)]).violations) == 1
    # a value nobody wrote, or the restore in another partition
    assert len(failover_check([kept, op(1, 2, READ, output=7, call=10, ret=11)]).violations) == 1
    lost = [kept, op(1, 1, WRITE, 2, call=4, ret=5), op(2, 2, READ, output=1, call=10, ret=11)]
    report = check_history(lost, restores=[Restore(1, **FAILOVER)], partition_of=lambda key: 0)
    assert len(report.violations) == 1 and not report.documented_loss
    # reads after the restore that disagree with each other
    assert len(failover_check([kept, op(1, 1, WRITE, 2, call=4, ret=5), op(2, 2, READ, output=1, call=10, ret=11),
                               op(3, 2, READ, output=2, call=12, ret=13)]).violations) == 1


def test_the_search_is_fast_on_long_concurrent_histories():
    """A simulated register: 6000 operations by 8 processes on 3 keys, one stale read added at the end."""
    rnd = random.Random(7)
    clock, planned = [0.0] * 8, []
    for i in range(6000):
        p = rnd.randrange(8)
        call = clock[p] + rnd.random() * 0.1
        clock[p] = ret = call + rnd.random()
        planned.append((rnd.uniform(call, ret), i, p, rnd.choice([READ, WRITE, CAS]), rnd.randrange(3), call, ret))
    values, ops = {}, []
    for _, i, p, kind, key, call, ret in sorted(planned):
        current = values.get(key)
        if kind == WRITE:
            values[key] = i
        if kind == CAS and current == i - 1:
            values[key] = i
        value = {READ: None, WRITE: i, CAS: (i - 1, i)}[kind]
        output = {READ: current, WRITE: None, CAS: current == i - 1}[kind]
        ops.append(Operation(i, p, kind, key, value, output, call, ret))
    assert check_history(ops).ok
    last = max(clock)
    ops.append(Operation(6000, 99, READ, 0, None, -1, last + 1, last + 2))
    assert len(check_history(ops).violations) == 1


# -- compare-and-set ------------------------------------------------------------------


def exercise_compare_and_set(rs):
    s, t = rs.value_state("cas"), rs.value_state("cas_ttl", ttl=3600)
    for state in (s, t):
        assert state.compare_and_set("a", None, 1)  # None: absent
        assert not state.compare_and_set("a", None, 2)
        assert not state.compare_and_set("a", 2, 3)
        assert state.compare_and_set("a", 1, [1, "x"])
        assert state.compare_and_set("a", [1, "x"], 4)
        assert state.get("a") == 4
    assert not s.compare_and_set("a", 4.0, 5)  # values compare by their encoding


def test_compare_and_set_embedded(tmp_path):
    with rockstate.open(str(tmp_path), partitions=4) as rs:
        exercise_compare_and_set(rs)


@gen_cluster(nodes=2, partitions=4)
def test_compare_and_set_on_a_cluster_loses_no_update(cluster):
    """Threads increment one counter by compare-and-set loops: every successful one counts."""
    with cluster.connect() as rs:
        exercise_compare_and_set(rs)
        counter = rs.value_state("counter")
        counter.put("n", 0)
        done = []

        def increment(times):
            for _ in range(times):
                while True:
                    n = counter.get("n")
                    if counter.compare_and_set("n", n, n + 1):
                        done.append(1)
                        break

        threads = [threading.Thread(target=increment, args=(25,)) for _ in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert len(done) == 100 and counter.get("n") == 100


# -- recorded histories on multi-process clusters ---------------------------------------


def linearizable_cluster(tmp_path, backup_count: int = 1) -> ContextManager[LocalCluster]:
    # heartbeat 2 s: at 1 s a loaded machine's stalls were taken for deaths (each one a promotion and a re-copy)
    return local_cluster(nodes=3, partitions=8, root=str(tmp_path / "cluster"), processes=True,
                         checkpoints=f"file://{tmp_path}/checkpoints", heartbeat_timeout=2.0, backup_count=backup_count)


@pytest.mark.timeout(120)
def test_no_violation_while_partitions_migrate(tmp_path):
    history = History()
    with linearizable_cluster(tmp_path) as cluster:
        with cluster.connect() as admin:
            keys = keys_for(admin)
            with Workload(cluster, history, keys) as load:
                load.wait_ops(30)
                cluster.add_node()  # partitions move to it
                load.wait_ops(30)
                cluster.stop_node(cluster.nodes()[0].node_id)  # graceful: its partitions move away
                cluster.wait_balanced()
                load.wait_ops(30)
            moved = [e for e in cluster.status()["events"] if e["event"] == "migration_finished"]
    report = check_history(history)
    print(report, load.kinds())
    assert report.ok, str(report)
    assert not report.documented_loss
    kinds = load.kinds()
    assert len(moved) >= 4 and kinds["cas applied"] > 0 and min(kinds[k] for k in (READ, WRITE, CAS)) > 0, kinds


@pytest.mark.timeout(120)
def test_failover_loses_only_writes_after_the_checkpoint_and_the_checker_says_so(tmp_path):
    """Clients keep going through a SIGKILL; besides their keys, one witness key per partition is written
    only by the test, before and after the checkpoint, and read after the failover: on the victim's
    partitions its loss is certain to be observed."""
    history = History()
    clock = history.clock

    def witness(rs, kind, key, value=None):
        op = history.invoke("witness", kind, key, value)
        history.ok(op, rs.value_state("register").get(key) if kind == READ else rs.value_state("register").put(key, value))

    with linearizable_cluster(tmp_path, backup_count=0) as cluster:  # the checkpoint restore, without backups
        with cluster.connect(retry_timeout=30) as admin:
            both = keys_for(admin, per_partition=2)
            keys, witnesses = both[0::2], both[1::2]
            with Workload(cluster, history, keys) as load:
                for key in witnesses:
                    witness(admin, WRITE, key, "checkpointed")
                load.wait_ops(30)
                started = clock()
                checkpoint = admin.checkpoint()
                checkpointed = clock()
                for key in witnesses:
                    witness(admin, WRITE, key, "after the checkpoint")
                load.wait_ops(30)  # writes after the checkpoint: lost where the victim owned the partition
                victim = cluster.nodes()[0].node_id
                lost_pids = set(admin.backend.refresh().owned_by(victim))
                seen = admin.backend.events()
                after = seen[-1]["seq"] if seen else 0
                kill_started = clock()
                cluster.kill_node(victim)
                killed = clock()
                restored_events = []

                def all_restored():
                    restored_events.extend(e for e in admin.backend.events(after=after) if e["event"] == "partition_restored"
                                           and e not in restored_events)
                    return {e["partition"] for e in restored_events} == lost_pids

                wait_until(all_restored, 30, "the victim's partitions to be restored")
                restored = clock()
                for key in witnesses:
                    witness(admin, READ, key)
                load.wait_ops(30)
    assert lost_pids and {e["checkpoint"] for e in restored_events} == {checkpoint.id}
    restores = [Restore(pid, (kill_started, killed), restored, checkpoint=(started, checkpointed), checkpoint_id=checkpoint.id)
                for pid in sorted(lost_pids)]
    partition_of = functools.partial(keyhash.partition_of, partitions=cluster.partitions)
    report = check_history(history, restores=restores, partition_of=partition_of)
    print(report, load.kinds())
    assert report.ok, str(report)  # nothing but the documented loss
    lost_witnesses = {k for k in witnesses if partition_of(k) in lost_pids}
    assert lost_witnesses <= {d.key for d in report.documented_loss}, str(report)
    for loss in report.documented_loss:
        assert loss.restore.partition in lost_pids and partition_of(loss.key) in lost_pids
        assert all(started < o.ret <= killed for o in loss.lost), (started, killed, [str(o) for o in loss.lost])
        if loss.key in lost_witnesses:
            assert [o.value for o in loss.lost] == ["after the checkpoint"]
    assert {d.key for d in report.documented_loss} <= {k for k in both if partition_of(k) in lost_pids}


def test_old_owner_hearing_late_of_a_move_serves_no_stale_read(tmp_path):
    """A move commits while the old owner's copy of the new table is delayed: a client that already has
    the new table writes at the new owner, then a client still on the old table reads at the old one."""
    history = History()
    with local_cluster(nodes=1, partitions=2, root=str(tmp_path), processes=False) as cluster:
        old = cluster._runner.nodes[cluster.nodes()[0].node_id]
        apply = old._apply

        async def late_apply(table):
            if set(old.owned) - set(table.owned_by(old.node_id)):
                await asyncio.sleep(1.0)
            await apply(table)

        old._apply = late_apply
        with cluster.connect() as fresh, cluster.connect() as behind:
            def record(rs, process, kind, key, value=None):
                op = history.invoke(process, kind, key, value)
                state = rs.value_state("r")
                history.ok(op, state.get(key) if kind == READ else state.put(key, value))

            keys = keys_for(fresh)  # one per partition
            for key in keys:
                record(fresh, "fresh", WRITE, key, "old")
                record(behind, "behind", READ, key)  # its table is the one before the move
            new = cluster.add_node(wait=False)
            moved = wait_until(lambda: fresh.backend.refresh().owned_by(new.node_id), 30, "a move to commit")
            key = next(k for k in keys if fresh.partition_of(k) in moved)
            record(fresh, "fresh", WRITE, key, "new")
            record(behind, "behind", READ, key)
            cluster.wait_balanced()
    report = check_history(history)
    assert report.ok, str(report)
