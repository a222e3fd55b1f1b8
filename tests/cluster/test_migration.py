"""Topology changes under steady writes, on multi-process clusters: no acknowledged write is lost."""

import threading

from rockstate.cluster import protocol as p
from rockstate.local.cluster import wait_until
from rockstate.errors import RockstateError
from rockstate.rpc.client import Channel
from rockstate.testing.cluster import gen_cluster, local_cluster


class SteadyWriter:
    """Writes key -> increasing version in a loop; remembers the last acknowledged version of each key."""

    def __init__(self, rs, keys: int = 400) -> None:
        self.state = rs.value_state("steady")
        self.keys = keys
        self.acked: dict[int, int] = {}
        self.errors: list[Exception] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        version = 0
        while not self._stop.is_set():
            version += 1
            batch = {k: version for k in range(version % 4, self.keys, 4)}
            try:
                self.state.put_many(batch)
            except RockstateError as e:  # not acknowledged: not counted
                self.errors.append(e)
                continue
            self.acked.update(batch)

    def __enter__(self):
        self._thread.start()
        wait_until(lambda: len(self.acked) == self.keys, 30, "the writer to cover every key")
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(30)

    def check(self) -> None:
        stored = self.state.get_many(range(self.keys))
        lost = {k: (v, stored[k]) for k, v in self.acked.items() if stored[k] is None or stored[k] < v}
        assert not lost, f"acknowledged writes lost: {dict(list(lost.items())[:5])}"
        assert not self.errors, self.errors[:3]


def owners_agree(cluster, rs) -> None:
    """Every node serves exactly the partitions the table gives it: no partition has two owners."""
    table = rs.backend.refresh()
    for node in cluster.nodes():
        with Channel(node.address) as channel:
            served = set(channel.call(p.NodeStats())["partitions"])
        assert {int(x) for x in served} == set(table.owned_by(node.node_id)), node.node_id


@gen_cluster(nodes=2, partitions=12, processes=True)
def test_join_under_steady_writes(cluster):
    with cluster.connect() as rs:
        with SteadyWriter(rs) as writer:
            cluster.add_node()
            status = cluster.wait_balanced()
        writer.check()
        assert sorted(n["partitions"] for n in status["nodes"] if n["status"] == "alive") == [4, 4, 4]
        moves = [e for e in cluster.status()["events"] if e["event"] == "migration_finished" and e["bytes"] > 0]
        assert moves and all(e["write_blocked_seconds"] < 5 for e in moves)
        owners_agree(cluster, rs)


@gen_cluster(nodes=3, partitions=12, processes=True)
def test_graceful_leave_under_steady_writes(cluster):
    with cluster.connect() as rs:
        with SteadyWriter(rs) as writer:
            cluster.stop_node(cluster.nodes()[1].node_id)
            cluster.wait_balanced()
        writer.check()
        owners_agree(cluster, rs)


@gen_cluster(nodes=2, partitions=8, processes=True)
def test_coordinator_killed_in_the_middle_of_a_move(cluster):
    with cluster.connect(retry_timeout=60) as rs:
        big = rs.value_state("big")
        for start in range(0, 40_000, 5000):  # enough data (~20 MB) that a move takes a moment
            big.put_many({i: b"x" * 500 for i in range(start, start + 5000)})
        cluster.add_node(wait=False)
        wait_until(lambda: any(e["event"] == "migration_started" for e in cluster.status()["events"]), 30, "a move")
        cluster.kill_coordinator()
        cluster.restart_coordinator()
        cluster.wait_balanced()
        wait_until(lambda: any(e["event"] == "coordinator_resumed" for e in cluster.status()["events"]), 30, "resume")
        assert big.get_many(range(0, 40_000, 97)) == [b"x" * 500] * len(range(0, 40_000, 97))
        assert big.count() == 40_000
        big.put(1, b"writable")  # nothing stayed frozen
        assert big.get(1) == b"writable"
        owners_agree(cluster, rs)


def test_clients_subscribe_to_cluster_events(tmp_path):
    seen = []
    with local_cluster(processes=True, nodes=1, partitions=4, root=str(tmp_path), heartbeat_timeout=1.0) as cluster:
        with cluster.connect() as rs:
            rs.value_state("e").put_many({i: i for i in range(100)})
            with rs.subscribe(seen.append):
                joined = cluster.add_node()
                cluster.kill_node(joined.node_id)
                wait_until(lambda: any(e["event"] == "member_dead" for e in seen), 20, "the death event")
            kinds = [e["event"] for e in seen]
            assert kinds.index("member_joined") < kinds.index("migration_finished") < kinds.index("member_dead")
            assert [e["seq"] for e in seen] == sorted({e["seq"] for e in seen})  # in order, each once
            assert any(e["event"] == "migration_finished" and e["target"] == joined.node_id for e in seen)
