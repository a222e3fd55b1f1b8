"""Reads of many keys as columns (``runs.py``): each owner gets its runs of keys in one ``Read`` and answers one
list; the values come back in the keys' order, whatever their kind and however many owners they reach, and an
owner that fails is retried alone, the others' answers kept."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import numpy as np
import pandas as pd
import pyarrow as pa

from rockstate.testing.cluster import gen_cluster

P = 256


def orders(n: int) -> dict:
    keys = [f"order-{i:05d}" for i in range(n // 2)] + [("eu", dt.date(2026, 11, 1 + i % 27), i) for i in range(n - n // 2)]
    return {k: {"n": i, "at": dt.datetime(2026, 11, 27, i % 24), "total": Decimal(i) / 100} for i, k in enumerate(keys)}


@gen_cluster(nodes=3, partitions=P, heartbeat_timeout=2.0, processes=True)
def test_a_read_of_many_partitions_answers_in_the_keys_order_in_every_shape(cluster):
    with cluster.connect() as rs:
        state = rs.value_state("orders")
        written = orders(4000)
        state.put_many(written)
        keys = list(written)
        shuffled = [keys[i] for i in np.random.default_rng(7).permutation(len(keys))]
        missing = [f"never-{i}" for i in range(50)]
        asked = shuffled[:2000] + missing + shuffled[2000:] + shuffled[:10]  # absent keys, and keys asked twice
        want = [written.get(k) for k in asked]
        assert state.get_many(asked) == want
        assert state.get_many(asked, default="none") == [written.get(k, "none") for k in asked]
        strings = [k for k in shuffled if isinstance(k, str)]
        for shape in (pd.Series(strings), np.array(strings), pa.array(strings)):
            assert state.get_many(shape) == [written[k] for k in strings]
        one = next(k for k in keys if isinstance(k, str))  # one owner's keys only, one partition's only
        same_partition = [k for k in strings if rs.partition_of(k) == rs.partition_of(one)]
        assert state.get_many(same_partition) == [written[k] for k in same_partition]
        assert state.get_many([]) == []
        assert rs.backend.get_many("orders", {3: [], 4: []}) == {3: [], 4: []}  # the backend's dict shape, empty
        assert state.get(one) == written[one]


@gen_cluster(nodes=3, partitions=P, heartbeat_timeout=2.0, processes=True)
def test_a_read_across_owners_through_a_kill_answers_every_key_once_its_backups_serve(cluster):
    """Its client's table names the killed node: the other owners answer at once, the killed node's runs are
    retried until its backups serve them, and every value lands in its key's place."""
    with cluster.connect(retry_timeout=60.0) as rs:
        state = rs.value_state("orders")
        written = orders(6000)
        state.put_many(written)
        keys = list(written)[::-1]
        table = rs.backend.refresh()
        victim = cluster.nodes()[0]
        assert sum(owner == victim.node_id for owner in table.owners) >= P // 4  # the read reaches every node
        cluster.kill_node(victim.node_id)
        assert state.get_many(keys) == [written[k] for k in keys]
        assert victim.node_id not in rs.backend.table.owners  # it was retried on the new table
