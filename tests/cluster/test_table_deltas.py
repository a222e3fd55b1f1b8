"""A new table reaches a node holding the one before as a delta (its changed rows), and whole otherwise.

``Table.delta_from`` / ``Table.patched`` on random tables; the coordinator's choice per node, in an in-process
cluster through a join, a kill and a graceful leave (every node ends with the coordinator's table, row for row)."""

from __future__ import annotations

import random

import pytest

from rockstate.cluster import protocol as p
from rockstate.cluster.node.server import Node
from rockstate.cluster.table import Table
from rockstate.errors import ProtocolError
from rockstate.local.cluster import LocalCluster

NODES = [f"node-{i}" for i in range(1, 9)]


def random_table(rng: random.Random, partitions: int, epoch: int, replicated: bool = True) -> Table:
    owners = [rng.choice(NODES + [None]) for _ in range(partitions)]
    table = Table(epoch - 1, tuple(owners), {n: f"127.0.0.1:{4000 + i}" for i, n in enumerate(NODES)},
                  tuple(rng.randrange(epoch) for _ in range(partitions)))
    if not replicated:
        return table.with_owners(owners, table.addresses)
    backups = [rng.sample(NODES, rng.randrange(3)) for _ in range(partitions)]
    return table.with_replicas(owners, backups, [b[:rng.randrange(len(b) + 1)] for b in backups],
                               [rng.randrange(100) for _ in range(partitions)], 1, "sync", 1.5, table.addresses)


def changed(rng: random.Random, table: Table, rows: int) -> Table:
    """The next table with ``rows`` partitions' owners and replica sets changed, and a node's address."""
    owners, backups = list(table.owners), [list(b) for b in table.backups]
    in_sync, epochs = [list(s) for s in table.in_sync], list(table.replica_epochs)
    for pid in rng.sample(range(table.partitions), rows):
        owners[pid] = rng.choice(NODES)
        if backups:
            backups[pid] = rng.sample(NODES, 2)
            in_sync[pid], epochs[pid] = backups[pid][:1], epochs[pid] + 1
    addresses = table.addresses | {"node-9": "127.0.0.1:5000"}
    if not backups:
        return table.with_owners(owners, addresses)
    return table.with_replicas(owners, backups, in_sync, epochs, table.backup_count, table.replication,
                               table.replica_timeout, addresses)


@pytest.mark.parametrize("replicated", [True, False])
def test_a_delta_on_its_base_makes_exactly_the_new_table(replicated):
    rng = random.Random(7)
    for _ in range(50):
        base = random_table(rng, rng.choice([1, 16, 271, 1024]), 5, replicated)
        new = changed(rng, base, rng.randrange(min(base.partitions, 40) + 1))
        delta = new.delta_from(base)
        assert delta is not None and len(delta["rows"]) <= base.partitions
        assert base.patched(delta) == new
        wire = p.ApplyTable(delta=delta).to_wire()
        assert "table" not in wire  # a node of an earlier version refuses it (a field it lacks) and gets the whole
        assert base.patched(p.ApplyTable.from_wire(wire).delta) == new


def test_a_delta_needs_its_base_and_a_table_of_the_same_shape():
    rng = random.Random(3)
    base = random_table(rng, 64, 5)
    new = changed(rng, base, 4)
    delta = new.delta_from(base)
    assert new.patched(delta) is None  # not its base: the node answers its own epoch, and the whole table follows
    assert random_table(rng, 64, 9).patched(delta) is None
    assert new.delta_from(random_table(rng, 32, 5)) is None  # another partition count: whole
    assert new.delta_from(random_table(rng, 64, 5, replicated=False)) is None


@pytest.mark.parametrize("spoil", [
    lambda d: d.update(rows=[[64, "node-1", 1, [], [], 0]]),  # a partition past the table
    lambda d: d.update(rows=[[-1, "node-1", 1, [], [], 0]]),
    lambda d: d.update(rows=[[1, 7, 1, [], [], 0]]),  # an owner that is not a name
    lambda d: d.update(rows=[[1, "node-1", 1, [3], [], 0]]),
    lambda d: d.update(rows=[[1, "node-1", 1, [], []]]),
    lambda d: d.update(rows="rows"),
    lambda d: d.update(epoch=5),  # not after its base
    lambda d: d.update(addresses={"node-1": 4000}),
    lambda d: d.update(replica_timeout="1"),
    lambda d: d.pop("base"),
])
def test_a_delta_that_is_not_a_tables_is_refused_and_changes_nothing(spoil):
    rng = random.Random(5)
    base = random_table(rng, 64, 5)
    delta = changed(rng, base, 3).delta_from(base)
    spoil(delta)
    before = base.to_wire()
    with pytest.raises(ProtocolError):
        base.patched(delta)
    assert base.to_wire() == before


@pytest.mark.parametrize("wire", [{"op": "apply_table"}, {"op": "apply_table", "table": {}, "delta": {}}])
def test_apply_table_carries_a_table_or_a_delta(wire):
    with pytest.raises(ProtocolError, match="a table or a delta"):
        p.ApplyTable.from_wire(wire)


def test_nodes_take_tables_as_deltas_through_a_join_a_kill_and_a_leave_and_end_with_the_coordinators(tmp_path, monkeypatch):
    taken: list[str] = []
    apply_table = Node.apply_table

    async def counted(self, msg, conn):
        taken.append("delta" if msg.delta is not None else "whole")
        return await apply_table(self, msg, conn)

    monkeypatch.setattr(Node, "apply_table", counted)
    with LocalCluster(nodes=3, partitions=64, root=str(tmp_path), processes=False, backup_count=1,
                      heartbeat_timeout=1.5) as c:
        with c.connect() as rs:
            rs.value_state("s").put_many({f"k{i}": i for i in range(500)})
        c.add_node()
        c.wait_replicated()
        c.kill_node(c.nodes()[0].node_id)
        c.wait_replicated()
        c.stop_node(c.nodes()[0].node_id)
        c.wait_replicated()
        coordinator = next(iter(c._runner.coordinators.values()))
        table = coordinator.state.table
        for node in c._runner.nodes.values():
            assert node.table == table
        with c.connect() as rs:
            assert rs.value_state("s").get_many([f"k{i}" for i in range(500)]) == list(range(500))
    assert taken.count("delta") > 5 * taken.count("whole") > 0, taken  # a node's first table (and a joining one's) is whole
