"""The coordinator's record kept by both keepers: its data directory, and documents on a real ZooKeeper."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from rockstate.local.cluster import wait_until
from rockstate.cluster.coordinator.persistence import EVENT_WINDOW, DataDirectory, ZooKeeperDocuments
from rockstate.cluster.table import Table
from rockstate.errors import NotLeaderError, StaleVersionError


def a_record(epoch: int = 3) -> dict:
    nodes = {f"node-{i}": f"10.1.0.{i}:7{i}01" for i in (1, 2)}
    table = Table(epoch, ("node-1", "node-2", None, "node-1"), nodes, (1, 2, 0, 3))
    return {"table": table.to_wire(),
            "states": [{"name": "orders", "kind": "value", "ttl": None}],
            "members": {n: {"address": a, "status": "alive"} for n, a in nodes.items()}, "next_id": 3,
            "pipelines": {str(uuid.UUID(int=7)): {"query": str(uuid.UUID(int=7)), "batches": [{"batch": 4, "at": "2026-11-23T10:00:00Z"}]}},
            "failovers": ["node-3"]}


def test_the_data_directory_keeps_the_record_as_coordinator_json(tmp_path):
    keeper = DataDirectory(str(tmp_path))
    assert keeper.load() == {}
    asyncio.run(keeper.save(a_record()))
    with open(tmp_path / "coordinator.json") as f:
        assert json.load(f) == a_record()
    assert DataDirectory(str(tmp_path)).load() == a_record()


@pytest.fixture
def leader(open_store):
    """A keeper on a store whose contender leads, and the errors it was refused with."""
    def start(identifier: str):
        store = open_store()
        leadership = store.leadership(identifier).start()
        wait_until(lambda: leadership.leading or identifier in leadership.standbys(), 5, f"{identifier} to contend")
        refused = []
        return ZooKeeperDocuments(store, leadership, refused.append), leadership, refused
    return start


def test_a_record_round_trips_as_documents_and_only_changed_documents_are_written(leader, open_store):
    keeper, leadership, _ = leader("10.0.0.1:7400")
    assert leadership.leading and keeper.load() == {}

    async def run():
        keeper.events.append("member_joined", node="node-1", address="10.1.0.1:7101")
        await keeper.save(a_record(epoch=3))
        first = dict(keeper._versions)
        await keeper.save({**a_record(epoch=4)})  # only the table changed
        return first, dict(keeper._versions)

    first, second = asyncio.run(run())
    store = keeper.store
    assert store.names() == ["events", "failovers", "membership", "pipelines", "states", "table"]
    assert {n for n in first if second[n] != first[n]} == {"table"}
    assert store.read("membership").data == {"members": a_record()["members"], "next_id": 3}

    reader = ZooKeeperDocuments(open_store(), leadership, lambda e: None)
    assert reader.load() == a_record(epoch=4)
    assert [e["event"] for e in reader.events.after(0)] == ["member_joined"]
    assert reader.events.append("member_left", node="node-1")["seq"] > 1 + 50  # past any the last leader gave unkept


def test_the_event_window_is_kept_by_itself_and_bounded(leader):
    keeper, _, _ = leader("10.0.0.1:7400")
    keeper.load()

    async def run():
        await keeper.save(a_record())
        for i in range(EVENT_WINDOW + 30):
            keeper.events.append("checkpoint_completed", checkpoint=i)  # no record change: saved by itself
        await asyncio.sleep(0)
        while keeper._flush is not None and not keeper._flush.done() or keeper._saved["events"]["events"][-1]["seq"] != keeper.events.seq:
            await asyncio.sleep(0.01)

    asyncio.run(run())
    kept = keeper.store.read("events").data["events"]
    assert len(kept) == EVENT_WINDOW and kept[-1]["checkpoint"] == EVENT_WINDOW + 29


def test_a_deposed_leaders_save_is_refused_and_it_is_told_to_stop(leader, open_store):
    keeper, leadership, refused = leader("10.0.0.1:7400")
    keeper.load()
    asyncio.run(keeper.save(a_record(epoch=3)))
    successor, successor_leadership, _ = leader("10.0.0.2:7400")
    leadership.stop()  # deposed (as a lost session would): the successor leads
    wait_until(lambda: successor_leadership.leading, 5, "the standby to lead")
    assert successor.load() == a_record(epoch=3)
    asyncio.run(successor.save(a_record(epoch=4)))

    with pytest.raises(NotLeaderError) as raised:
        asyncio.run(keeper.save(a_record(epoch=9)))
    assert raised.value.data["leader"] == "10.0.0.2:7400" and refused == [raised.value]
    assert successor.store.read("table").data["table"]["epoch"] == 4


def test_a_save_at_an_old_version_is_refused_even_while_leading(leader, open_store):
    keeper, leadership, refused = leader("10.0.0.1:7400")
    keeper.load()
    asyncio.run(keeper.save(a_record(epoch=3)))
    other = ZooKeeperDocuments(open_store(), leadership, lambda e: None)
    other.load()
    asyncio.run(other.save(a_record(epoch=4)))  # written behind the first keeper's back

    with pytest.raises(StaleVersionError):
        asyncio.run(keeper.save(a_record(epoch=5)))
    assert len(refused) == 1 and keeper.store.read("table").data["table"]["epoch"] == 4
