"""A client retrying a partition that lost its owner waits for the coordinator's next table, not for its backoff."""

import asyncio
import threading
import time

import pytest

from rockstate.cluster import protocol as p
from rockstate.cluster.coordinator.events import EventLog
from rockstate.cluster.coordinator.state import ClusterState
from rockstate.cluster.table import Table
from rockstate.local.cluster import wait_until
from rockstate.retry import Retry
from rockstate.testing.cluster import local_cluster

HEARTBEAT_TIMEOUT = 1.5


def test_a_wait_for_a_newer_table_ends_as_the_nodes_get_one_and_a_retry_takes_the_promotion_at_once(tmp_path):
    with local_cluster(processes=True, nodes=3, partitions=16, root=str(tmp_path / "cluster"),
                       heartbeat_timeout=HEARTBEAT_TIMEOUT, backup_count=1) as cluster:
        with cluster.connect(retry_timeout=60) as rs:
            backend, state = rs.backend, rs.value_state("orders")
            state.put_many({f"order-{i}": {"amount": i} for i in range(500)})
            cluster.wait_replicated(30)
            epoch = backend.refresh().epoch

            # nothing changes: the wait ends after its seconds with no table (the client keeps its own)
            start = time.monotonic()
            assert backend._coordinator.call(p.GetTable(newer_than=epoch, wait=0.3)) is None
            assert time.monotonic() - start >= 0.25  # (the two clocks apart by a few microseconds)
            # one older than the coordinator's: answered at once, whole
            assert backend._coordinator.call(p.GetTable(newer_than=epoch - 1, wait=30))["epoch"] == epoch

            victim = cluster.nodes()[0].node_id
            key = next(f"order-{i}" for i in range(500) if backend.table.owners[rs.partition_of(f"order-{i}")] == victim)
            # another client's retry wait of 120 s (longer than a GetTable may wait: it asks for 60), and nothing else
            other = cluster.connect(retry_timeout=60)
            assert other.backend.table.epoch == epoch
            waiter = threading.Thread(target=other.backend.tables.wait, args=(120.0,), daemon=True)
            waiter.start()
            # every wait a retry draws is 30 s: a client that slept them out would answer long after the promotion
            backend.retry = Retry(deadline=60, initial=30, maximum=30)
            after = cluster.status()["events"][-1]["seq"]
            cluster.kill_node(victim)
            assert state.get(key) == {"amount": int(key.split("-")[1])}
            served = time.time()
            waiter.join(30)
            assert not waiter.is_alive() and other.backend.table.epoch > epoch  # it ended with the first newer table sent
            other.close()
            promoted = wait_until(lambda: [e for e in cluster.status()["events"]
                                           if e["seq"] > after and e["event"] == "primary_promoted"], 10, "the promotion")
            # the coordinator's clock is this machine's: the read came within a second of the first promotion
            assert served - promoted[0]["time"] < 1.0, (served, promoted[0])
            assert backend.table.owners[rs.partition_of(key)] != victim


def test_a_get_table_that_does_not_wait_carries_no_new_field():
    """A coordinator of an earlier version refuses a field it does not know: a plain GetTable is what it was."""
    assert p.GetTable().to_wire() == {"op": "get_table"}
    assert p.GetTable(newer_than=3, wait=0.5).to_wire() == {"op": "get_table", "newer_than": 3, "wait": 0.5}
    assert p.GetTable.from_wire({"op": "get_table"}) == p.GetTable()
    with pytest.raises(Exception, match="wait"):
        p.GetTable(wait=-1.0)


def test_a_waiting_get_table_ends_when_the_nodes_have_a_newer_table_not_when_the_coordinator_makes_one():
    """``ClusterState.newer_table``, the coordinator's side alone (no I/O in it)."""
    async def main():
        state = ClusterState(Table.empty(4), EventLog(None))
        first = state.table.with_owners(["n1"] * 4, {"n1": "127.0.0.1:1"})
        state.table = first
        state.table_sent(first.epoch)
        assert await state.newer_table(first.epoch - 1, 30)  # the nodes have a newer one: at once
        start = time.monotonic()
        assert not await state.newer_table(first.epoch, 0.2)  # none newer: after the wait
        assert time.monotonic() - start >= 0.15
        waiting = asyncio.ensure_future(state.newer_table(first.epoch, 30))
        state.table = first.with_owners(["n2"] * 4, {"n2": "127.0.0.1:2"})  # made, not yet sent
        await asyncio.sleep(0.05)
        assert not waiting.done()
        start = time.monotonic()  # one asking now waits too; at the end of its wait it takes what there is
        assert await state.newer_table(first.epoch, 0.2) and time.monotonic() - start >= 0.15
        assert not waiting.done()
        state.table_sent(state.table.epoch)
        assert await asyncio.wait_for(waiting, 5)

    asyncio.run(main())
