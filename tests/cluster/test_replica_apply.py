"""``ReplicaApply``: one message per backup node carrying many partitions' batches, each partition's in order.

The message's checks (untrusted input: every item checked before any batch applies), and a real primary's
``Primaries`` feeding a real backup's ``Backups`` (each over its own ``Store``) frame by frame, without the
network in between, so a frame can be lost, repeated or overtaken by a partition's move at will.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque

import msgpack
import pytest

from rockstate.cluster import protocol as p
from rockstate.cluster.protocol.node import MAX_REPLICA_ITEMS
from rockstate.cluster.replication.backup import Backups
from rockstate.cluster.replication.outcomes import Applied, Report
from rockstate.cluster.replication.primary import Primaries
from rockstate.cluster.replication.runs import Runs, stored_piece
from rockstate.cluster.replication.sender import Sender
from rockstate import errors
from rockstate.config import StoreConfig
from rockstate.errors import ProtocolError
from rockstate.ops import DELETE_MANY, PUT, PUT_MANY, RAW_PUT, RAW_PUT_MANY
from rockstate.store import StateSpec, Store
from rockstate.store.writes import stored_bytes

PIDS = (0, 1, 2, 3)


def _put(key: bytes) -> list:
    return [RAW_PUT, "s", key, b"v"]


@pytest.mark.parametrize("items", [
    [[0, 1, 2, [_put(b"k")]], [0, 1, 1, [_put(b"k")]]],  # a partition's batches out of order
    [[0, 1, 1, [_put(b"k")]], [0, 1, 1, [_put(b"k")]]],  # the same batch twice
    [[0, 1]],  # short
    [["0", 1, 1, None]],  # a partition that is no int
    [[-1, 1, 1, None]],  # out of range
    [[0, 1, 1 << 64, None]],
    [[0, 1, 1, "ops"]],
    [[0, 1, 1, [[99, "s", b"k", b"v"]]]],  # an op code that is not stored
    [[0, 1, 1, [[RAW_PUT, 5, b"k", b"v"]]]],  # a state that is no str
    [[0, 1, 1, [[RAW_PUT, "s", 5, b"v"]]]],
    [[0, 1, 1, [[RAW_PUT, "s", b"k"]]]],
    [[0, 1, 1, [[RAW_PUT_MANY, "s", [b"a", b"b"], [b"v"]]]]],  # keys and values that would pair off wrong
    [[0, 1, 1, [[RAW_PUT_MANY, "s", b"ab", [b"v", b"w"]]]]],
    [[0, 1, 1, [[DELETE_MANY, "s", b"ab", None]]]],
    "not a list",
])
def test_a_malformed_message_is_refused_whole(items):
    with pytest.raises(ProtocolError):
        p.ReplicaApply.from_wire({"op": "replica_apply", "items": items})


def test_a_message_is_bounded():
    with pytest.raises(ProtocolError, match="at most"):
        p.ReplicaApply.from_wire({"op": "replica_apply", "items": [[0, 1, 0, None]] * (MAX_REPLICA_ITEMS + 1)})
    p.ReplicaApply.from_wire({"op": "replica_apply", "items": [[pid, 1, 1, [_put(b"k")]] for pid in range(100)]
                              + [[0, 1, 2, None], [0, 1, 2, [_put(b"j")]]]})


@pytest.mark.parametrize("bad", [
    [RAW_PUT, "s", b"k", None],  # a value that is not bytes
    [RAW_PUT_MANY, "s", [b"k", b"j"], [b"v", 5]],
    [RAW_PUT_MANY, "s", [b"k", "j"], [b"v", b"w"]],  # a key that is not bytes
])
def test_a_batch_put_that_cannot_be_stored_fails_its_message_and_writes_nothing_of_it(tmp_path, bad):
    """Batches of puts only are staged together (``Partition.stage_replicated_puts``): one bad item, found as the
    entries are made or written, leaves every partition of the message as it was, positions included."""
    _, backup_store = _stores(tmp_path)
    backups = Backups(lambda: backup_store)
    for pid in PIDS:
        backups.adopt(pid, 1, 0)
    good = [[pid, 1, 1, [[RAW_PUT_MANY, "s", [b"a", b"b"], [b"1", b"2"]], _put(b"k")]] for pid in PIDS[:3]]
    items = p.ReplicaApply.from_wire({"op": "replica_apply", "items": [*good, [3, 1, 1, [_put(b"x"), bad]]]}).items
    with pytest.raises(ProtocolError):
        backups._apply(items)
    assert backups._apply([[pid, 1, 0, None] for pid in PIDS]) == [[pid, 0, Applied.OK] for pid in PIDS]
    assert all(backup_store.get_many(pid, "s", [b"a", b"k", b"x"]) == [None] * 3 for pid in PIDS)
    assert sorted(map(tuple, backups._apply(good))) == [(pid, 1, Applied.OK) for pid in PIDS[:3]]
    assert [backup_store.get_many(pid, "s", [b"a", b"b", b"k"]) for pid in PIDS[:3]] == [[b"1", b"2", b"v"]] * 3


def _stores(tmp_path) -> tuple[Store, Store]:
    stores = []
    for name in ("primary", "backup"):
        store = Store(str(tmp_path / name), StoreConfig(partitions=len(PIDS)))
        store.define_state(StateSpec("s", "value"))
        stores.append(store)
    return stores[0], stores[1]


def test_many_partitions_in_one_frame_each_in_order_through_a_lost_frame_and_a_move(tmp_path):
    primary_store, backup_store = _stores(tmp_path)
    reports: list = []
    primaries = Primaries(lambda: primary_store, lambda *r: reports.append(r), lambda *r: reports.append(r), lambda: 5.0)
    backups = Backups(lambda: backup_store)

    async def run() -> None:
        primaries.on_loop()
        primaries.sender("b")
        for pid in PIDS:
            primaries.lead(pid, 1, ("b",), ("b",), "sync", lambda pid, seq: [])
            backups.adopt(pid, 1, 0)

        written = iter(range(100))

        def write(n: int) -> None:
            for i in [next(written) for _ in range(n)]:
                for pid in PIDS:
                    primary_store.write(pid, [(PUT, "s", f"k{pid}-{i}".encode(), f"v{i}".encode())])

        def send(deliver: bool = True, answer: bool = True) -> list:
            out = primaries.outgoing("b", False)
            if not out.items:
                return []
            msg = p.ReplicaApply.from_wire(p.ReplicaApply(items=out.items).to_wire())  # as the backup decodes it
            if not deliver:
                primaries.unreachable("b", {i[0] for i in out.items})
                return out.items
            replies = backups._apply(msg.items)
            if answer:
                primaries.answered("b", replies, out.carried)
            else:
                primaries.unreachable("b", {i[0] for i in out.items})
            return replies

        # three batches of every partition ride in one frame, each partition's in its order
        write(3)
        waiting = asyncio.ensure_future(primaries.acknowledged(PIDS))
        await asyncio.sleep(0)
        assert not waiting.done()
        replies = send()
        assert sorted(map(tuple, replies)) == [(pid, 3, Applied.OK) for pid in PIDS]
        await asyncio.wait_for(waiting, 5)

        # a frame the backup never gets: the next carries its batches again, in order
        write(2)
        lost = send(deliver=False)
        assert {(i[0], i[2]) for i in lost} == {(pid, s) for pid in PIDS for s in (4, 5)}
        write(1)
        primaries._dirty.setdefault("b", set()).update(PIDS)  # the sender's full look after an unreachable backup
        assert sorted(map(tuple, send())) == [(pid, 6, Applied.OK) for pid in PIDS]
        await asyncio.wait_for(primaries.acknowledged(PIDS), 5)

        # a frame applied whose answer is lost: sent again, the backup skips what it holds and says where it is
        write(1)
        send(answer=False)
        primaries._dirty.setdefault("b", set()).update(PIDS)
        assert sorted(map(tuple, send())) == [(pid, 7, Applied.OK) for pid in PIDS]

        # a batch past a gap (a frame overtaken): answered with the backup's position, resent from there
        write(1)
        out = primaries.outgoing("b", False)
        assert sorted(map(tuple, backups._apply([i for i in out.items if i[2] != 8] + [[0, 1, 9, [_put(b"x")]]]))) \
            [0] == (0, 7, Applied.BEHIND)
        primaries._dirty.setdefault("b", set()).update(PIDS)
        assert sorted(map(tuple, send())) == [(pid, 8, Applied.OK) for pid in PIDS]

        # partition 2 moves away from the backup between frames: the others go on, it answers not ready
        backups.forget(2)
        backup_store.close_partition(2, drop=True)
        write(1)
        assert sorted(map(tuple, send())) == [(0, 9, Applied.OK), (1, 9, Applied.OK), (2, 0, Applied.NOT_READY),
                                              (3, 9, Applied.OK)]
        # a deposed primary's batch (an older replica epoch) is refused as stale
        backups.configure(3, 2)
        assert backups._apply([[3, 1, 10, [_put(b"late")]]]) == [[3, 9, Applied.STALE]]
        primaries.stop()

    asyncio.run(run())
    try:
        for pid in (0, 1, 3):  # the backup holds exactly the primary's data, batch after batch
            assert backup_store.partition(pid).seq() == primary_store.partition(pid).seq() == 9
            assert backup_store.scan(pid, "s") == primary_store.scan(pid, "s")
            assert len(backup_store.scan(pid, "s")) == 9
    finally:
        primary_store.close()
        backup_store.close()


def test_the_batches_replicas_keep_stay_within_their_bytes_and_a_promoted_copy_resends_what_it_kept(tmp_path):
    """With two backups a partition, each partition keeps half to all of its share of ``kept_bytes`` of the batches
    every backup applied (trimmed once past it, the newest at least), a primary's log and a backup's tail alike; a
    backup behind keeps what it lacks on the primary, whatever it weighs; a promoted backup's tail is what it kept,
    in order."""
    primary_store, backup_store = _stores(tmp_path)
    budget = 4 * 20_000  # each of the 4 partitions: ~20 KB, ~20 of the ~1 KB batches below, not TAIL (64)
    primaries = Primaries(lambda: primary_store, lambda *r: None, lambda *r: None, lambda: 5.0, budget)
    backups = Backups(lambda: backup_store, budget)
    value = b"v" * 800

    async def run() -> None:
        primaries.on_loop()
        primaries.sender("b")
        primaries.sender("c")
        for pid in PIDS:
            primaries.lead(pid, 1, ("b", "c"), ("b", "c"), "sync", lambda pid, seq: [])
            backups.adopt(pid, 1, 0)
        for i in range(100):
            for pid in PIDS:
                primary_store.write(pid, [(PUT, "s", b"k%d" % i, value)])
            out = primaries.outgoing("b", False)
            replies = backups._apply(p.ReplicaApply.from_wire(p.ReplicaApply(items=out.items).to_wire()).items)
            primaries.answered("b", replies, out.carried)
            primaries.outgoing("c", False)
            primaries.answered("c", replies, out.carried)  # "c" applied the same (its own backup, not run here)
        primaries.outgoing("b", True)  # a full look trims the logs
        assert 0 < primaries.kept() <= budget and 0 < backups.kept() <= budget
        assert all(8 <= len(primaries._logs[pid]) < 25 and 8 <= len(backups._tails[pid]) < 25 for pid in PIDS)
        tail = backups.promoted(0, 100)
        assert [e[0] for e in tail] == list(range(101 - len(tail), 101))  # the newest, in order
        # a backup behind: what it lacks stays in the log past the budget (100 batches of partition 1)
        for i in range(100):
            primary_store.write(1, [(PUT, "s", b"late%d" % i, value)])
        primaries.outgoing("b", True)
        assert [e[0] for e in primaries._logs[1]][-100:] == list(range(101, 201)) and primaries.kept() > budget
        primaries.stop()

    try:
        asyncio.run(run())
    finally:
        primary_store.close()
        backup_store.close()


def test_idle_in_sync_copies_are_probed_only_when_asked_joining_ones_at_every_look(tmp_path):
    """A sender's look over idle partitions probes the joining copies every time (a probe's answer is what finds a
    copy caught up) and the in-sync ones only with ``probe_in_sync`` (the sender asks once a replica timeout: the
    probes of every look were a resting node's CPU). A probe-only message takes no partition's lock."""
    primary_store, backup_store = _stores(tmp_path)
    reports: list = []
    primaries = Primaries(lambda: primary_store, lambda *r: reports.append(r), lambda *r: reports.append(r), lambda: 5.0)
    backups = Backups(lambda: backup_store)

    async def run() -> None:
        primaries.on_loop()
        primaries.sender("b")
        for pid in PIDS:  # 0 and 1 in sync with "b"; 2 and 3 with "b" joining
            primaries.lead(pid, 1, ("b",), ("b",) if pid < 2 else (), "sync", lambda pid, seq: [])
            backups.adopt(pid, 1, 0)
        for pid in PIDS:
            primaries.copied("b", pid, 0)
        quiet = primaries.outgoing("b", True, probe_in_sync=False)
        assert sorted((i[0], i[2], i[3]) for i in quiet.items) == [(2, 0, None), (3, 0, None)]
        full = primaries.outgoing("b", True)
        assert sorted(i[0] for i in full.items) == list(PIDS) and all(i[3] is None for i in full.items)
        held, release = threading.Event(), threading.Event()

        def writer() -> None:  # holds every partition's lock, as a long write would
            locks = [backup_store.partition(pid).lock for pid in PIDS]
            for lock in locks:
                lock.acquire()
            held.set()
            release.wait(30)
            for lock in locks:
                lock.release()

        holder = threading.Thread(target=writer)
        holder.start()
        held.wait(5)
        answered: list = []
        probe = threading.Thread(target=lambda: answered.append(
            backups._apply(p.ReplicaApply.from_wire(p.ReplicaApply(items=full.items).to_wire()).items)))
        probe.start()
        probe.join(5)
        waited = probe.is_alive()
        release.set()
        holder.join(5)
        probe.join(5)
        assert answered and not waited, "the probes waited for the writer's locks"
        replies = answered[0]
        assert sorted(map(tuple, replies)) == [(pid, 0, Applied.OK) for pid in PIDS]
        primaries.answered("b", replies, full.carried)
        primaries.stop()

    try:
        asyncio.run(run())
    finally:
        primary_store.close()
        backup_store.close()


def test_a_requests_partitions_are_queued_for_their_senders_once_and_a_write_nobody_waits_on_at_the_next_turn(tmp_path):
    """What a write ships joins the logs at once, and reaches the senders' queues when the request waits for its
    acknowledgement (one wake per backup node, whatever its number of partitions), or at the loop's next turn
    when nobody waits (a sweep's write); a sender asking ``outgoing`` meanwhile finds it too."""
    primary_store, backup_store = _stores(tmp_path)
    primaries = Primaries(lambda: primary_store, lambda *r: None, lambda *r: None, lambda: 5.0)
    backups = Backups(lambda: backup_store)

    async def run() -> None:
        primaries.on_loop()
        wake = primaries.sender("b")
        for pid in PIDS:
            primaries.lead(pid, 1, ("b",), ("b",), "sync", lambda pid, seq: [])
            backups.adopt(pid, 1, 0)
        wake.clear()
        sets: list[int] = []
        real_set = wake.set
        wake.set = lambda: (sets.append(1), real_set())  # type: ignore[method-assign]
        primary_store.write_all([(pid, [(PUT, "s", b"k", b"v")]) for pid in PIDS], b"\0" * 8 + b"r1" * 4)
        assert not primaries.pending("b") and not wake.is_set() and sets == []  # in the logs, not yet queued
        waiting = asyncio.ensure_future(primaries.acknowledged(PIDS))
        await asyncio.sleep(0)
        assert primaries.pending("b") and wake.is_set() and sets == [1]  # one wake for the request's 4 partitions
        out = primaries.outgoing("b", False)
        assert sorted((i[0], i[2]) for i in out.items) == [(pid, 1) for pid in PIDS]
        primaries.answered("b", backups._apply(out.items), out.carried)
        await asyncio.wait_for(waiting, 5)

        wake.clear()
        primary_store.write(2, [(PUT, "s", b"swept", b"v")])  # nobody waits on it
        assert not wake.is_set()
        await asyncio.sleep(0)
        assert wake.is_set() and primaries.pending("b")
        primary_store.write(3, [(PUT, "s", b"k2", b"v")])
        assert sorted(i[0] for i in primaries.outgoing("b", False).items) == [2, 3]  # a sender's look queues first
        primaries.stop()

    try:
        asyncio.run(run())
    finally:
        primary_store.close()
        backup_store.close()


def test_a_backup_behind_a_primary_whose_log_is_empty_is_reported_at_once(tmp_path):
    """A promoted copy without a tail (or a new primary) has an empty log: a backup it counts in sync that answers
    from behind cannot be brought up from it, and is reported unreachable at the next look (it catches up anew),
    rather than left waited for until the replica timeout."""
    primary_store, backup_store = _stores(tmp_path)
    reports: list = []
    primaries = Primaries(lambda: primary_store, lambda *r: reports.append(r), lambda *r: reports.append(r), lambda: 5.0)
    backups = Backups(lambda: backup_store)

    async def run() -> None:
        primaries.on_loop()
        primaries.sender("b")
        primaries.lead(0, 1, ("b",), ("b",), "sync", lambda pid, seq: [])
        for _ in range(3):
            primary_store.write(0, [(PUT, "s", b"k", b"v")])  # batches "b" never gets
        primaries.step_down(0)  # and leads again, as a promoted copy without a tail would: its log starts empty
        primaries.lead(0, 2, ("b",), ("b",), "sync", lambda pid, seq: [])
        backups.adopt(0, 2, 0)
        probe = primaries.outgoing("b", True)
        assert [(i[0], i[3]) for i in probe.items] == [(0, None)]
        primaries.answered("b", backups._apply(probe.items), probe.carried)  # at 0, behind the primary's 3
        assert reports == []
        primaries.outgoing("b", False)
        assert reports == [(0, "b", Report.UNREACHABLE)]
        primaries.stop()

    try:
        asyncio.run(run())
    finally:
        primary_store.close()
        backup_store.close()


def test_a_partitions_log_with_one_backup_keeps_no_batch_it_applied_and_resends_what_it_lacks(tmp_path):
    """With one backup a partition (the default) nothing but that backup reads the primary's log (a step-down drops
    it), and its position, once answered, never goes back: so its answer frees the batches it applied at once, and
    keeps those past its position for a resend. Positions assumed rather than answered (a new primary's in-sync
    backups), and a dropped backup's late answer, trim nothing."""
    primary_store, backup_store = _stores(tmp_path)
    primaries = Primaries(lambda: primary_store, lambda *r: None, lambda *r: None, lambda: 5.0, 1 << 20)
    backups = Backups(lambda: backup_store)

    async def run() -> None:
        primaries.on_loop()
        primaries.sender("b")
        for pid in (0, 1):
            primaries.lead(pid, 1, ("b",), ("b",), "sync", lambda pid, seq: [])
        for i in (1, 2):
            primary_store.write(0, [(PUT, "s", b"k%d" % i, b"v")])
        tail = list(primaries._logs[0])
        primaries.step_down(0)  # and leads again as a promoted backup would, its tail through batch 2 its log
        primaries.lead(0, 2, ("b",), ("b",), "sync", lambda pid, seq: tail if pid == 0 else [])
        primaries.outgoing("b", True)
        assert [e[0] for e in primaries._logs[0]] == [1, 2] and primaries.kept() > 0  # "b" assumed at 2: none answered
        backups.adopt(0, 2, 1)  # "b" holds batch 1 only
        backups.adopt(1, 1, 0)
        for pid in (0, 1):
            primary_store.write(pid, [(PUT, "s", b"k3", b"v")])
        out = primaries.outgoing("b", False)
        assert sorted((i[0], i[2]) for i in out.items) == [(0, 3), (1, 1)]
        replies = backups._apply(out.items, out.runs)
        assert sorted(map(tuple, replies)) == [(0, 1, Applied.BEHIND), (1, 1, Applied.OK)]
        primaries.answered("b", replies, out.carried)
        assert [e[0] for e in primaries._logs[0]] == [2, 3] and primaries._logs[1] == deque()  # what it lacks is kept
        out = primaries.outgoing("b", False)  # and resent
        assert [(i[0], i[2]) for i in out.items] == [(0, 2), (0, 3)]
        primaries.answered("b", backups._apply(out.items, out.runs), out.carried)
        assert primaries._logs[0] == deque() and primaries.kept() == 0
        assert backup_store.get_many(0, "s", [b"k2", b"k3"]) == [b"v", b"v"]
        # "b" replaced by "c" (behind it, say): a late answer of "b" frees nothing "c" may lack
        primaries.lead(1, 2, ("c",), (), "sync", lambda pid, seq: [])
        primaries.copied("c", 1, 1)
        primary_store.write(1, [(PUT, "s", b"k4", b"v")])
        primaries.answered("b", [[1, 2, Applied.OK]], {})
        assert [e[0] for e in primaries._logs[1]] == [2]
        primaries.answered("c", [[1, 2, Applied.OK]], {})
        assert primaries._logs[1] == deque()
        primaries.stop()

    try:
        asyncio.run(run())
    finally:
        primary_store.close()
        backup_store.close()


# -- runs: batch puts' pieces, carried compactly -------------------------------------------------------------------

def _run(pids=(0, 1), seqs=(1, 1), counts=(1, 2), keys=(b"a", b"b", b"c"), request=b"r" * 16) -> list:
    return ["s", request, list(pids), [1] * len(pids), list(seqs), list(counts), list(keys), [b"v"] * len(keys)]


@pytest.mark.parametrize("runs", [
    [_run()[:7]],  # short
    [["s", b"r", 0, [1], [1], [1], [b"a"], [b"v"]]],  # a column that is no list
    [[5, *_run()[1:]]],  # a state that is no str
    [["s", "r", *_run()[2:]]],  # a request id that is not bytes
    [_run(pids=("0", 1))],
    [_run(pids=(-1, 1))],
    [_run(seqs=(0, 1))],  # no batch 0
    [_run(counts=(2, 2))],  # more keys counted than carried
    [_run(counts=(-1, 4))],
    [_run()[:7] + [[b"v"]]],  # a value short
    [_run(), _run()],  # a partition's batch twice
    [_run(pids=(0, 0), seqs=(2, 1))],  # out of order within a run
    "not a list",
])
def test_a_malformed_run_is_refused_whole(runs):
    with pytest.raises(ProtocolError) as refused:
        p.ReplicaApply.from_wire({"op": "replica_apply", "items": [], "runs": runs})
    assert refused.value.data.get("field") == "runs" or runs == "not a list"


def test_a_runs_batches_follow_the_items_of_its_partitions_and_count_toward_the_bound():
    with pytest.raises(ProtocolError, match="follows"):
        p.ReplicaApply.from_wire({"op": "replica_apply", "items": [[0, 1, 1, [_put(b"k")]]], "runs": [_run(seqs=(1, 1))]})
    p.ReplicaApply.from_wire({"op": "replica_apply", "items": [[0, 1, 1, [_put(b"k")]]], "runs": [_run(seqs=(2, 1))]})
    many = MAX_REPLICA_ITEMS // 2 + 1
    with pytest.raises(ProtocolError, match="at most"):
        p.ReplicaApply.from_wire({"op": "replica_apply", "items": [[0, 1, 0, None]] * many,
                                  "runs": [_run(pids=range(1, many + 1), seqs=[1] * many, counts=[0] * many, keys=())]})
    assert "runs" not in p.ReplicaApply(items=[]).to_wire()  # a node of an earlier version knows no such field


def _over_wire(msg: p.ReplicaApply) -> p.ReplicaApply:
    """As the backup decodes it."""
    return p.ReplicaApply.from_wire(msgpack.unpackb(msgpack.packb(msg.to_wire(), use_bin_type=True), raw=False))


def _batch_put(store: Store, request: bytes, pids=PIDS, tag: str = "") -> None:
    store.write_groups([(pid, [(PUT_MANY, "s", [f"{tag}{pid}-{i}".encode() for i in range(pid + 1)],
                                [f"v{tag}{i}".encode() for i in range(pid + 1)])]) for pid in pids], request)


def test_batch_puts_go_as_runs_and_leave_the_backup_as_items_would(tmp_path):
    """A batch put's pieces go to the backup as runs (a partition's batches all in runs, in order, or all as
    items); applied, the backup holds what the items would have left: the keys, the request ids (a promoted copy
    still answers a retry once), its position, and a tail of the very batches the items carry."""
    primary_store, backup_store = _stores(tmp_path)
    items_store = Store(str(tmp_path / "items"), StoreConfig(partitions=len(PIDS)))
    items_store.define_state(StateSpec("s", "value"))
    primaries = Primaries(lambda: primary_store, lambda *r: None, lambda *r: None, lambda: 5.0)
    backups, by_items = Backups(lambda: backup_store), Backups(lambda: items_store)

    async def run() -> None:
        primaries.on_loop()
        primaries.sender("b")
        for pid in PIDS:
            primaries.lead(pid, 1, ("b",), ("b",), "sync", lambda pid, seq: [])
            backups.adopt(pid, 1, 0)
            by_items.adopt(pid, 1, 0)
        requests = [bytes([n]) * 16 for n in range(1, 5)]
        _batch_put(primary_store, requests[0])
        _batch_put(primary_store, requests[1], tag="x")  # each partition's second batch: in the second run
        primary_store.write(3, [(PUT, "s", b"single", b"v")])  # partition 3's third batch is no put's: all its as items
        waiting = asyncio.ensure_future(primaries.acknowledged(PIDS))
        await asyncio.sleep(0)
        out = primaries.outgoing("b", False)
        assert [(run[1], run[2], run[4]) for run in out.runs] == [(requests[0], [0, 1, 2], [1, 1, 1]),
                                                                   (requests[1], [0, 1, 2], [2, 2, 2])]
        assert [(i[0], i[2]) for i in out.items] == [(3, 1), (3, 2), (3, 3)]
        msg = _over_wire(p.ReplicaApply(items=out.items, runs=out.runs))
        replies = backups._apply(msg.items, msg.runs)
        assert sorted(map(tuple, replies)) == [(0, 2, Applied.OK), (1, 2, Applied.OK), (2, 2, Applied.OK), (3, 3, Applied.OK)]
        logs = {pid: list(primaries._logs[pid]) for pid in PIDS}  # before the answer frees them (one backup)
        primaries.answered("b", replies, out.carried)
        await asyncio.wait_for(waiting, 5)
        # the same batches as items, to another backup
        by_items._apply(_over_wire(p.ReplicaApply(items=[[pid, 1, seq, stored] for pid in PIDS
                                                         for seq, stored, _ in logs[pid]])).items)
        for pid in PIDS:
            assert backups._tails[pid] == by_items._tails[pid] and backups._tail_bytes[pid] == by_items._tail_bytes[pid]
            assert backup_store.scan(pid, "s") == items_store.scan(pid, "s") == primary_store.scan(pid, "s")
            assert backup_store.partition(pid).seq() == primary_store.partition(pid).seq()
        # a retry of the first request, on the backup promoted: applied before, it applies nothing
        retry = [(0, [(PUT_MANY, "s", [b"0-0"], [b"again"])]), (1, [(PUT_MANY, "s", [b"1-0"], [b"again"])])]
        assert backup_store.write_groups(retry, requests[0]) == [False, False]
        assert backup_store.get_many(0, "s", [b"0-0"]) == [b"v0"]
        assert backup_store.write_groups(retry, requests[2]) == [True, True]  # a new request applies
        primaries.stop()

    try:
        asyncio.run(run())
    finally:
        for store in (primary_store, backup_store, items_store):
            store.close()


def test_a_runs_pieces_are_each_checked_as_items_are(tmp_path):
    """A piece the backup applied before is skipped, one past a gap answers the backup's position, one of a
    deposed primary is refused as stale, one of a copy not held is not ready; the run's other pieces apply."""
    _, backup_store = _stores(tmp_path)
    backups = Backups(lambda: backup_store)
    for pid in PIDS[:3]:
        backups.adopt(pid, 1, 0)
    assert backups._apply([], [_run(pids=(0,), seqs=(1,), counts=(1,), keys=(b"a",))]) == [[0, 1, Applied.OK]]
    backups.configure(2, 3)
    replies = backups._apply([], [_run(pids=(0, 1, 2, 3), seqs=(1, 2, 1, 1), counts=(1, 1, 1, 1), keys=(b"a", b"b", b"c", b"d"))])
    assert sorted(map(tuple, replies)) == [(0, 1, Applied.OK), (1, 0, Applied.BEHIND), (2, 0, Applied.STALE), (3, 0, Applied.NOT_READY)]
    assert backups._apply([], [_run(pids=(1, 0), seqs=(1, 2), counts=(2, 1), keys=(b"x", b"y", b"z"))]) == [[1, 1, Applied.OK], [0, 2, Applied.OK]]
    assert backup_store.get_many(1, "s", [b"x", b"y", b"b"]) == [b"v", b"v", None]
    assert backup_store.get_many(0, "s", [b"a", b"z"]) == [b"v", b"v"]
    assert [e[0] for e in backups._tails[0]] == [1, 2] and [e[0] for e in backups._tails[1]] == [1]
    # a run whose middle piece applied before: the others are kept in their tails as the items they stand for
    backups.adopt(3, 1, 0)
    replies = backups._apply([], [_run(pids=(0, 1, 3), seqs=(3, 1, 1), counts=(1, 2, 2), keys=(b"p", b"q", b"r", b"s", b"t"))])
    assert sorted(map(tuple, replies)) == [(0, 3, Applied.OK), (1, 1, Applied.OK), (3, 1, Applied.OK)]
    assert backup_store.get_many(1, "s", [b"q", b"r"]) == [None, None]  # the resent piece is not written again
    request = _run()[1]
    assert backups._tails[0][-1] == (3, stored_piece("s", request, [b"p"], [b"v"]), stored_bytes(stored_piece("s", request, [b"p"], [b"v"])))
    assert backups._tails[3][-1] == (1, stored_piece("s", request, [b"s", b"t"], [b"v", b"v"]),
                                     stored_bytes(stored_piece("s", request, [b"s", b"t"], [b"v", b"v"])))
    assert [e[0] for e in backups._tails[1]] == [1]
    backup_store.close()


def test_a_partitions_only_backup_keeps_no_tail_and_one_of_two_keeps_it_again(tmp_path):
    """With one backup a partition (the default) no replica can be behind a promoted one, so a backup keeps no tail
    of what it applied, in runs or items; promoted it resends nothing. A second backup in the row brings the tail back."""
    _, backup_store = _stores(tmp_path)
    backups = Backups(lambda: backup_store)
    for pid in PIDS:
        backups.configure(pid, 1, sole=pid != 2)  # before the copy is adopted, as a new backup's table comes first
        backups.adopt(pid, 1, 0)
    request = _run()[1]
    assert backups._apply([[3, 1, 1, stored_piece("s", request, [b"i"], [b"v"])]],
                          [_run(pids=(0, 1, 2), seqs=(1, 1, 1), counts=(1, 1, 1))]) == [
        [3, 1, Applied.OK], [0, 1, Applied.OK], [1, 1, Applied.OK], [2, 1, Applied.OK]]  # items first, then runs
    assert backup_store.get_many(3, "s", [b"i"]) == backup_store.get_many(2, "s", [b"c"]) == [b"v"]
    assert set(backups._tails) == {2} and [e[0] for e in backups._tails[2]] == [1]
    assert backups.kept() == stored_bytes(stored_piece("s", request, [b"c"], [b"v"]))
    backups.configure(0, 1, sole=False)  # a second backup joins partition 0's row
    backups.configure(2, 1, sole=True)  # and partition 2's other backup leaves it: its tail goes
    assert backups._apply([], [_run(pids=(0, 2), seqs=(2, 2), counts=(1, 1), keys=(b"x", b"y"))]) == [
        [0, 2, Applied.OK], [2, 2, Applied.OK]]
    assert [e[0] for e in backups._tails[0]] == [2] and 2 not in backups._tails
    assert backups.promoted(1, 2) == [] and [e[0] for e in backups.promoted(0, 2)] == [2]
    backup_store.close()


@pytest.mark.parametrize("bad", [
    _run(keys=(b"a", "b", b"c")),  # a key that is not bytes
    ["s", b"r" * 16, [0, 1], [1, 1], [1, 1], [1, 2], [b"a", b"b", b"c"], [b"v", None, b"w"]],  # a value that is not
])
def test_a_run_that_cannot_be_stored_fails_its_message_and_writes_nothing_of_it(tmp_path, bad):
    _, backup_store = _stores(tmp_path)
    backups = Backups(lambda: backup_store)
    for pid in PIDS:
        backups.adopt(pid, 1, 0)
    msg = p.ReplicaApply.from_wire({"op": "replica_apply", "items": [[3, 1, 1, [_put(b"k")]]], "runs": [bad]})
    with pytest.raises(ProtocolError):
        backups._apply(msg.items, msg.runs)
    assert [backups._applies[pid].last_applied for pid in PIDS] == [0] * 4
    assert all(backup_store.get_many(pid, "s", [b"a", b"b", b"c", b"k"]) == [None] * 4 for pid in PIDS)
    backup_store.close()


def test_a_backup_of_an_earlier_version_refuses_runs_once_and_gets_items_from_then_on(tmp_path):
    """A node of an earlier version refuses a message with a field it lacks. Its primary's sender then sends it
    the same batches as items, and no more runs; the backup is not reported behind for it. (The earlier version
    cannot run here: the stand-in channel answers as its decoding does, with the error through its wire form,
    and hands what it accepts to a real ``Backups``.)"""
    primary_store, backup_store = _stores(tmp_path)
    reports: list = []
    primaries = Primaries(lambda: primary_store, lambda *r: reports.append(r), lambda *r: reports.append(r), lambda: 5.0)
    backups = Backups(lambda: backup_store)
    calls: list[bool] = []

    class EarlierNode:
        async def call(self, msg: p.ReplicaApply, timeout: float) -> list:
            wire = msgpack.unpackb(msgpack.packb(msg.to_wire(), use_bin_type=True), raw=False)
            calls.append("runs" in wire)
            if "runs" in wire:
                refused = ProtocolError("'replica_apply' message has unknown field 'runs'", op="replica_apply", field="runs")
                raise errors.from_wire(refused.to_wire())
            return backups._apply(p.ReplicaApply.from_wire(wire).items)

    async def run() -> None:
        primaries.on_loop()
        sender = Sender("b", primaries, lambda address: EarlierNode(), lambda node: "b:1", lambda: 5.0)
        for pid in PIDS:
            primaries.lead(pid, 1, ("b",), ("b",), "sync", lambda pid, seq: [])
            backups.adopt(pid, 1, 0)
        for n in range(2):
            _batch_put(primary_store, bytes([n + 1]) * 16, tag=str(n))
            waiting = asyncio.ensure_future(primaries.acknowledged(PIDS))
            await asyncio.sleep(0)
            await sender.send_once(full=False)
            if n == 0:
                assert calls == [True] and not waiting.done() and primaries.pending("b")
                await sender.send_once(full=False)
            await asyncio.wait_for(waiting, 5)
        assert calls == [True, False, False] and reports == []
        primaries.stop()

    try:
        asyncio.run(run())
        for pid in PIDS:
            assert backup_store.scan(pid, "s") == primary_store.scan(pid, "s") and len(backup_store.scan(pid, "s")) == 2 * (pid + 1)
    finally:
        primary_store.close()
        backup_store.close()


def test_a_partitions_batches_ride_in_runs_only_in_the_order_the_backup_applies_them():
    """Runs are applied in order, after the items: a partition whose batches would ride in one run twice (a request
    that wrote it twice) or in an earlier run than a batch before them goes as items."""
    def entry(seq: int, request: bytes, state: str = "s") -> tuple:
        return (seq, [(RAW_PUT_MANY, state, [b"k%d" % seq], [b"v"]), (RAW_PUT, "_requests", request, b"w")], 100)

    runs = Runs()
    assert runs.add(0, 1, [entry(1, b"A"), entry(2, b"B")])  # runs A, B
    assert runs.add(1, 1, [entry(5, b"B")])
    assert not runs.add(2, 1, [entry(3, b"B"), entry(4, b"A")])  # B before A: A's run comes first
    assert not runs.add(3, 1, [entry(1, b"C"), entry(2, b"C")])  # one run twice
    assert not runs.add(4, 1, [entry(1, b"C"), (2, [(RAW_PUT, "s", b"k", b"v")], 10)])  # a batch that is no put's
    assert runs.add(5, 1, [entry(7, b"A"), entry(8, b"C")])  # A, then a new run
    assert [(run[1], run[2], run[4]) for run in runs.wire()] == [(b"A", [0, 5], [1, 7]), (b"B", [0, 1], [2, 5]),
                                                                  (b"C", [5], [8])]
