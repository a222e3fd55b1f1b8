"""Replicated partitions on multi-process clusters: kill -9 of primaries under single-key reads, writes,
compare-and-sets and appends, checked by the history checker: no violation, and no acknowledged write lost
(nothing restored from a checkpoint, so the checker's documented-loss bucket is empty)."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from rockstate.cluster.client.bulk import write_sst
from rockstate.local.cluster import wait_until
from rockstate.errors import RockstateError
from rockstate.serde import _pack
from rockstate.testing.history import History, check_history
from rockstate.testing.workload import Workload, keys_for
from rockstate.testing.cluster import gen_cluster, local_cluster


HEARTBEAT_TIMEOUT = 2.0  # a loaded 2-core machine can stall a node's loop past 1 s: no false deaths here


class Appends:
    """Threads appending unique items to their own list key; every acknowledged append must stay, in order."""

    def __init__(self, cluster, threads: int = 2) -> None:
        self.cluster, self.acked = cluster, [[] for _ in range(threads)]
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def _run(self, i: int) -> None:
        with self.cluster.connect(retry_timeout=15.0, timeout=10.0) as rs:
            items, n = rs.list_state("journal"), 0
            while not self._stop.is_set():
                n += 1
                try:
                    items.append(f"writer-{i}", {"n": n, "at": "2026-11-23T15:00:00Z"})
                except RockstateError:
                    continue  # may or may not be in: only acknowledged ones are checked
                self.acked[i].append(n)

    def __enter__(self) -> "Appends":
        for th in self._threads:
            th.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for th in self._threads:
            th.join(30)

    def check(self, rs) -> int:
        journal = rs.list_state("journal")
        for i, acked in enumerate(self.acked):
            stored = [item["n"] for item in journal.get(f"writer-{i}") or []]
            assert len(stored) == len(set(stored)), f"writer-{i}: an append applied twice"
            assert stored == sorted(stored), f"writer-{i}: appends out of order"
            missing = sorted(set(acked) - set(stored))
            assert not missing, (f"writer-{i} (partition {rs.partition_of(f'writer-{i}')}): {len(missing)} acknowledged "
                                 f"appends lost: {missing[:10]}; {len(stored)} stored: {stored[:5]}...{stored[-5:]}")
        return sum(map(len, self.acked))


def promoted(cluster, after: int = 0) -> list[dict]:
    return [e for e in cluster.status()["events"] if e["event"] == "primary_promoted" and e["seq"] > after]


def in_sync_beyond(status: dict, nodes: set[str]) -> bool:
    """Whether every partition has an in-sync replica (its elected primary, or an in-sync backup) outside ``nodes``."""
    return all((r["primary"] not in nodes and not r["waiting_for_election"])
               or any(b["in_sync"] and b["node"] not in nodes for b in r["backups"]) for r in status["replicas"])


def last_event(cluster) -> int:
    events = cluster.status()["events"]
    return events[-1]["seq"] if events else 0


def run_kills(tmp_path, nodes: int, backup_count: int, kills: list[list[int]]) -> None:
    """Clients keep going while, round by round, the nodes at these positions are killed at once."""
    history = History()
    with local_cluster(processes=True, nodes=nodes, partitions=8, root=str(tmp_path / "cluster"), heartbeat_timeout=HEARTBEAT_TIMEOUT,
                      backup_count=backup_count) as cluster:
        with cluster.connect(retry_timeout=30) as admin:
            keys = keys_for(admin)
            with Workload(cluster, history, keys) as load, Appends(cluster) as appends:
                load.wait_ops(30)
                for positions in kills:
                    running = cluster.nodes()
                    victims = [running[i].node_id for i in positions]
                    table = admin.backend.refresh()
                    lost = {pid for v in victims for pid in table.owned_by(v)}
                    after = last_event(cluster)
                    for victim in victims:
                        cluster.kill_node(victim)
                    wait_until(lambda: {e["partition"] for e in promoted(cluster, after)} >= lost, 30,
                               f"partitions {sorted(lost)} promoted")
                    load.wait_ops(30)
                cluster.wait_replicated(60)  # re-replicated on the survivors
                load.wait_ops(20)
            events = [e["event"] for e in cluster.status()["events"]]
            total = appends.check(admin)
    report = check_history(history)
    print(report, load.kinds(), f"{total} appends")
    assert report.ok, str(report)
    assert not report.documented_loss and "partition_restored" not in events
    kinds = load.kinds()
    assert kinds["cas applied"] > 0 and kinds["batch writes"] > 0 and total > 0, kinds


@pytest.mark.timeout(150)
def test_kill_9_of_a_primary_loses_no_acknowledged_write(tmp_path):
    run_kills(tmp_path, nodes=3, backup_count=1, kills=[[0]])


@pytest.mark.timeout(150)
def test_two_backups_survive_two_simultaneous_kills(tmp_path):
    run_kills(tmp_path, nodes=4, backup_count=2, kills=[[0, 1]])


@pytest.mark.timeout(150)
def test_a_kill_during_re_replication_loses_nothing(tmp_path):
    """Two backups; a second node dies while the first one's partitions are being re-replicated."""
    history = History()
    with local_cluster(processes=True, nodes=4, partitions=8, root=str(tmp_path / "cluster"), heartbeat_timeout=HEARTBEAT_TIMEOUT, backup_count=2) as cluster:
        with cluster.connect(retry_timeout=30) as admin:
            admin.value_state("bulk").put_many({f"order-{i:06d}": {"amount": i, "day": "2026-11-23"} for i in range(20_000)})
            keys = keys_for(admin)
            with Workload(cluster, history, keys) as load:
                load.wait_ops(20)
                first, second = [n.node_id for n in cluster.nodes()[:2]]
                after = last_event(cluster)
                cluster.kill_node(first)
                wait_until(lambda: promoted(cluster, after), 30, "a promotion")
                copying = wait_until(lambda: [e for e in cluster.status()["events"] if e["seq"] > after
                                              and e["event"] == "replica_copied"], 30, "re-replication under way")
                # what backup_count=2 promises after one death: every partition keeps an in-sync replica beyond
                # `second` (a loaded machine can leave a backup out of sync for a while: that is a third failure)
                wait_until(lambda: in_sync_beyond(cluster.status(), {first, second}), 60, "an in-sync replica beyond the second")
                cluster.kill_node(second)
                wait_until(lambda: all(n["status"] != "alive" for n in cluster.status()["nodes"]
                                       if n["node_id"] in (first, second)), 30, "both declared dead")
                cluster.wait_replicated(60)
                load.wait_ops(20)
            assert admin.value_state("bulk").get("order-012345") == {"amount": 12345, "day": "2026-11-23"}
            assert admin.value_state("bulk").count() == 20_000
            events = [e["event"] for e in cluster.status()["events"]]
    report = check_history(history)
    print(report, load.kinds(), len(copying))
    assert report.ok and not report.documented_loss and "partition_restored" not in events, str(report)


class InSyncSampler:
    """Samples the status API: each partition's in-sync replicas (its primary and in-sync backups) below
    ``wanted`` are kept (``short``), but for a partition whose primary reported a backup behind or cut off
    (``replica_out_of_sync``: the in-sync rule at work, no move's doing), counted apart (``lagged``)."""

    def __init__(self, cluster, wanted: int) -> None:
        self.cluster, self.wanted = cluster, wanted
        self.samples, self.moving, self.short, self.lagged = 0, 0, [], 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                status = self.cluster.status()
            except RockstateError:
                continue  # a loaded machine: the next sample
            self.samples += 1
            self.moving += bool(status["moves"])  # samples taken mid-move: the ones this checks
            lagged = {e["partition"] for e in status["events"] if e["event"] == "replica_out_of_sync"}
            for r in status["replicas"]:
                in_sync = (0 if r["waiting_for_election"] else 1) + sum(b["in_sync"] for b in r["backups"])
                if in_sync < self.wanted and r["partition"] in lagged:
                    self.lagged += 1
                elif in_sync < self.wanted:
                    self.short.append((r, [n["node_id"] + ":" + n["status"] for n in status["nodes"]]))

    def __enter__(self) -> "InSyncSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)


@pytest.mark.timeout(300)
def test_joins_and_a_graceful_leave_keep_every_partition_in_sync_and_a_kill_9_mid_move_loses_nothing(tmp_path):
    """Primaries and backups move by add, catch up, then drop (a primary by a handover): sampled all along a join
    and a graceful leave, no partition ever has fewer in-sync replicas than backup_count + 1. Then another join's
    first handover has its source SIGKILLed while the target catches up: its partitions are promoted and the move
    planned anew. The history has no violation and no loss throughout."""
    history = History()
    with local_cluster(processes=True, nodes=3, partitions=8, root=str(tmp_path / "cluster"), heartbeat_timeout=HEARTBEAT_TIMEOUT,
                      backup_count=1, coordinator_settings={"replica_timeout": 5.0}) as cluster:  # fewer lags at load
        with cluster.connect(retry_timeout=30) as admin:
            admin.value_state("bulk").put_many({f"order-{i:06d}": {"amount": i, "day": "2026-11-23"} for i in range(20_000)})
            keys = keys_for(admin)
            cluster.wait_replicated(60)
            with Workload(cluster, history, keys) as load, Appends(cluster) as appends:
                with InSyncSampler(cluster, 2) as sampler:
                    load.wait_ops(20)
                    joined = cluster.add_node()  # primaries and backups move to it
                    cluster.wait_replicated(90)
                    load.wait_ops(20)
                    cluster.stop_node(cluster.nodes()[0].node_id)  # graceful: it is drained
                    cluster.wait_replicated(90)
                    load.wait_ops(20)
                events = cluster.status()["events"]
                after = events[-1]["seq"]
                cluster.add_node(wait=False)
                [move] = wait_until(lambda: [e for e in cluster.status()["events"] if e["seq"] > after
                                             and e["event"] == "migration_started"][:1], 60, "a handover to begin")
                cluster.kill_node(move["source"])
                wait_until(lambda: any(e["event"] == "member_dead" for e in cluster.status()["events"] if e["seq"] > after),
                           30, f"{move['source']} declared dead")
                cluster.wait_replicated(90)
                load.wait_ops(20)
            killed = [e for e in cluster.status()["events"] if e["seq"] > after]
            total = appends.check(admin)
            assert admin.value_state("bulk").count() == 20_000
    report = check_history(history)
    moved = [e for e in events if e["event"] == "migration_finished"]
    print(report, load.kinds(), f"{total} appends, {sampler.samples} samples ({sampler.moving} mid-move, {sampler.lagged} partitions short after a "
          f"reported lag), {len(moved)} handovers; after the kill:", [e["event"] for e in killed if e["event"] != "replica_copied"])
    deaths = [e for e in events if e["event"] == "member_dead"]
    assert not deaths, f"a node was declared dead before the kill (the machine stalled it): {deaths}"
    assert sampler.moving >= 2 and not sampler.short, (
        f"{len(sampler.short)} samples below 2 in-sync replicas; first: {sampler.short[:2]}")
    assert any(e["target"] == joined.node_id for e in moved), moved
    assert not [e for e in events if e["event"] in ("partition_restored", "primary_promoted", "migration_failed")], events
    assert report.ok and not report.documented_loss, str(report)
    assert "partition_restored" not in {e["event"] for e in killed}, killed


@pytest.mark.timeout(120)
@gen_cluster(nodes=3, partitions=4, root="{tmp_path}/cluster", heartbeat_timeout=HEARTBEAT_TIMEOUT, processes=True)
def test_an_ingested_sst_file_survives_its_primarys_death(cluster, tmp_path):
    """An SST file is no batch a backup can apply: the backups catch up anew, and the ingest is acknowledged
    only once no backup without the file counts as in sync; then the primary is killed."""
    with cluster.connect(retry_timeout=30) as rs:
        state, backend = rs.value_state("loaded", create=True), rs.backend  # raw SST ingests first
        keys = [f"device-{i:05d}" for i in range(3000)]
        for pid in range(4):
            mine = sorted((_pack(k), _pack({"seen": "2026-11-23", "n": len(k)})) for k in keys if rs.partition_of(k) == pid)
            path = str(tmp_path / f"p{pid}.sst")
            write_sst(path, [k for k, _ in mine], [v for _, v in mine])
            assert backend.ingest_sst("loaded", pid, path) > 0
        state.put("after-the-load", 1)  # a batch after the file, on one partition
        cluster.wait_replicated(60)  # the backups copied the partitions anew (until then, fewer replicas)
        victim = backend.refresh().owners[0]
        after = last_event(cluster)
        cluster.kill_node(victim)
        wait_until(lambda: promoted(cluster, after), 30, "a promotion")
        assert state.get_many(keys) == [{"seen": "2026-11-23", "n": len(k)} for k in keys]
        assert state.get("after-the-load") == 1


@pytest.mark.timeout(120)
@gen_cluster(nodes=2, partitions=4, heartbeat_timeout=30.0, processes=True)
def test_read_from_backup_answers_while_the_primary_is_stopped(cluster):
    """A stale-read client reads the backups: with the primary's process stopped (SIGSTOP), it still answers;
    a client reading primaries (linearizable) cannot until the process goes on."""
    with cluster.connect() as rs, cluster.connect(read_from_backup=True, retry_timeout=5.0) as stale, \
            cluster.connect(retry_timeout=1.0, timeout=1.0) as strict:
        orders = {f"order-{i}": {"amount": i, "day": "2026-11-23"} for i in range(200)}
        rs.value_state("orders").put_many(orders)
        primary = cluster.node(rs.backend.refresh().owners[0])
        on_primary = [k for k in orders if rs.partition_of(k) == 0]
        os.kill(primary.pid, signal.SIGSTOP)
        try:
            assert stale.value_state("orders").get_many(on_primary) == [orders[k] for k in on_primary]
            with pytest.raises(RockstateError):
                strict.value_state("orders").get(on_primary[0])
        finally:
            os.kill(primary.pid, signal.SIGCONT)
        assert strict.value_state("orders").get(on_primary[0]) == orders[on_primary[0]]


@gen_cluster(nodes=1, partitions=12)
def test_a_partitions_replicas_are_in_distinct_zones(cluster):
    """Nodes started with --zone: with enough zones, no partition has two replicas in one zone."""
    zones = {cluster.nodes()[0].node_id: cluster.nodes()[0].node_id}  # a node without a zone is a zone of its own
    for zone in ("zone-a", "zone-a", "zone-b"):
        zones[cluster.add_node(zone=zone).node_id] = zone
    status = cluster.wait_replicated()
    for r in status["replicas"]:
        replicas = [r["primary"], *(b["node"] for b in r["backups"])]
        assert len(replicas) == 2 and len({zones[n] for n in replicas}) == 2, r


@pytest.mark.timeout(150)
@gen_cluster(nodes=3, partitions=16, heartbeat_timeout=HEARTBEAT_TIMEOUT, processes=True,
             coordinator_settings={"replication": "async"})
def test_async_replication_reaches_the_backups_and_a_kill_after_they_applied_loses_nothing(cluster):
    """``replication: async`` answers a write once its primary applied it, and the backups follow: once a stale-read
    client reads every write from the backups, a kill -9 of a primary's node loses none of them (a death may lose
    only what its backups had not applied yet: docs/guarantees.md). Batch puts in key order (more than 8 keys a
    partition), single puts and a compare-and-set, string and tuple keys."""
    cluster.wait_replicated(60)
    with cluster.connect(retry_timeout=30) as rs, cluster.connect(read_from_backup=True, retry_timeout=10) as stale:
        state = rs.value_state("orders")
        expected: dict = {}
        for batch in range(4):
            chunk = {f"order-{batch}-{i:05d}": {"amount": f"{i}.{batch}5", "day": "2026-11-28"} for i in range(500)}
            state.put_many(chunk)
            expected.update(chunk)
        for i in range(40):
            state.put(("tenant-7", i), i)
            expected["tenant-7", i] = i
        assert state.compare_and_set("order-0-00000", expected["order-0-00000"], {"amount": "0.00", "day": "void"})
        expected["order-0-00000"] = {"amount": "0.00", "day": "void"}
        keys = list(expected)
        backups = stale.value_state("orders")
        wait_until(lambda: backups.get_many(keys) == [expected[k] for k in keys], 30, "the backups hold every write")
        victim = rs.backend.refresh().owners[0]
        lost = set(rs.backend.refresh().owned_by(victim))
        after = last_event(cluster)
        cluster.kill_node(victim)
        wait_until(lambda: {e["partition"] for e in promoted(cluster, after)} >= lost, 30, f"partitions {sorted(lost)} promoted")
        assert state.get_many(keys) == [expected[k] for k in keys]
        assert "partition_restored" not in [e["event"] for e in cluster.status()["events"]]
