"""Batch puts and deletes as columns (``WriteRuns``, ``runs.py``): each owner gets its runs of keys in one request,
each run applied as the partition's ``Write`` group would be, once per request id; a node that does not know the
message gets groups, with the same request id."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import numpy as np
import pandas as pd
import pytest

from rockstate.cluster import protocol as p
from rockstate.cluster.client.backend import ClusterBackend
from rockstate.errors import ProtocolError, UnknownOperationError
from rockstate.rpc.client import Channel
from rockstate.serde import encode_key, encode_value
from rockstate.store import requests
from rockstate.testing.cluster import gen_cluster

P = 128


def orders(n: int, tag: int = 0) -> dict:
    keys = [f"order-{i:05d}" for i in range(n // 2)] + [("eu", dt.date(2026, 11, 1 + i % 27), i) for i in range(n - n // 2)]
    return {k: {"n": i + tag, "at": dt.datetime(2026, 11, 28, i % 24), "total": Decimal(i + tag) / 100} for i, k in enumerate(keys)}


def sent_messages(monkeypatch) -> list:
    """The messages the client sends its nodes (recorded, then sent as they are)."""
    sent: list = []
    call_all = ClusterBackend._call_all

    def recording(calls: list) -> list:
        sent.extend(type(msg) for _, msg in calls)
        return call_all(calls)
    monkeypatch.setattr(ClusterBackend, "_call_all", staticmethod(recording))
    return sent


def keys_written(cluster) -> int:
    """Keys the nodes applied, as they count them (a run applied again would count twice)."""
    total = 0
    for node in cluster.nodes():
        with Channel(node.address) as channel:
            total += channel.call(p.NodeFigures())["load"]["keys_written"]
    return total


@gen_cluster(nodes=3, partitions=P, heartbeat_timeout=2.0, processes=True)
def test_a_batch_put_and_delete_go_to_each_owner_as_one_write_runs_in_every_shape(cluster, monkeypatch):
    sent = sent_messages(monkeypatch)
    with cluster.connect() as rs:
        state = rs.value_state("orders")
        written = orders(3000)
        before = keys_written(cluster)
        state.put_many(written)
        assert sent == [p.WriteRuns] * 3  # one request per node, every partition's keys in it
        assert keys_written(cluster) - before == 3000
        assert state.get_many(list(written)) == list(written.values())
        strings = [k for k in written if isinstance(k, str)]
        changed = {k: {"n": -1, "total": Decimal("0.10")} for k in strings}
        for shape in (lambda: (pd.Series(list(changed.values()), index=strings),), lambda: (np.array(strings), list(changed.values()))):
            state.put_many(*shape())
            assert state.get_many(strings) == list(changed.values())
        del sent[:]
        state.delete_many(pd.Series(strings))
        assert sent == [p.WriteRuns] * 3
        assert state.get_many(strings) == [None] * len(strings)
        assert state.count() == 3000 - len(strings)
        one = [k for k in strings if rs.partition_of(k) == rs.partition_of(strings[0])]
        state.put_many(dict.fromkeys(one, 1))  # one partition: its group, as before
        assert state.get_many(one) == [1] * len(one)


@gen_cluster(nodes=3, partitions=P, heartbeat_timeout=2.0, processes=True)
def test_a_write_runs_sent_again_with_its_request_id_applies_nothing_and_a_bad_one_nothing_at_all(cluster):
    with cluster.connect() as rs:
        rs.value_state("orders").put(b"seed", 0)  # defines the state
        table = rs.backend.refresh()
        node = cluster.nodes()[0]
        mine = [pid for pid, owner in enumerate(table.owners) if owner == node.node_id][:4]
        keys = _keys_of(rs, mine)
        flat = [k for pid in mine for k in keys[pid]]
        counts = [len(keys[pid]) for pid in mine]
        request = requests.new_id()

        def runs(tag: int) -> p.WriteRuns:
            return p.WriteRuns(epoch=table.epoch, state="orders", pids=mine, counts=counts, keys=flat,
                               values=[encode_value(tag)] * len(flat), request=request)
        with Channel(node.address) as channel:
            channel.call(runs(1))
            channel.call(runs(2))  # a retry of the same request: every run applied before
            got = channel.call(p.Read(epoch=table.epoch, state="orders", pids=mine, counts=counts, keys=flat))
            assert got == [encode_value(1)] * len(flat)
            bad = p.WriteRuns(epoch=table.epoch, state="orders", pids=mine, counts=counts, keys=flat,
                              values=[encode_value(3)] * (len(flat) - 1) + ["not bytes"], request=requests.new_id())
            with pytest.raises(ProtocolError, match="bytes"):
                channel.call(bad)
            assert channel.call(p.Read(epoch=table.epoch, state="orders", pids=mine, counts=counts, keys=flat)) == got


def _keys_of(rs, pids: list[int]) -> dict[int, list[bytes]]:
    """Three encoded keys of each partition."""
    found: dict[int, list[bytes]] = {pid: [] for pid in pids}
    i = 0
    while any(len(v) < 3 for v in found.values()):
        key = f"run-{i}"
        pid = rs.partition_of(key)
        if pid in found and len(found[pid]) < 3:
            found[pid].append(encode_key(key))
        i += 1
    return found


@gen_cluster(nodes=3, partitions=P, heartbeat_timeout=2.0, processes=True)
def test_a_node_that_does_not_know_write_runs_gets_groups_with_the_same_request_id(cluster, monkeypatch):
    """A stand-in for a node of an earlier version (none can run here): the client's call to the first node answers
    what such a node answers a message it does not know; the other two apply their runs for real. The client then
    sends the whole put as groups with the request id it had: the runs applied are not applied again."""
    sent = sent_messages(monkeypatch)
    call_all = ClusterBackend._call_all
    with cluster.connect() as rs:
        old = cluster.nodes()[0].address

        def an_old_node(calls: list) -> list:
            refused = [i for i, (channel, msg) in enumerate(calls) if isinstance(msg, p.WriteRuns) and channel.address == old]
            answers = call_all([c for i, c in enumerate(calls) if i not in refused])
            for i in refused:
                answers.insert(i, UnknownOperationError("unknown operation 'write_runs'", op="write_runs"))
            return answers
        monkeypatch.setattr(ClusterBackend, "_call_all", staticmethod(an_old_node))
        state = rs.value_state("orders")
        written = orders(2000)
        before = keys_written(cluster)
        state.put_many(written)
        assert keys_written(cluster) - before == 2000  # each key applied once
        assert state.get_many(list(written)) == list(written.values())
        assert p.Write in sent
        del sent[:]
        state.put_many(orders(2000, tag=5))
        assert set(sent) == {p.Write}  # groups from then on
        assert state.get_many(list(written)) == list(orders(2000, tag=5).values())
