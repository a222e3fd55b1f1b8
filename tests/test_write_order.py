"""A batch put's keys reach each partition in key order (``runs.write_order``): RocksDB inserts them faster. The
order is a speed-up only: what a batch leaves is the same in every input shape, a key given twice keeps its last
value, and a batch of short runs keeps its given order."""

import datetime as dt
import uuid

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import rockstate
from rockstate.runs import SORTED_FROM, write_order
from rockstate.states import prepare_keys


@pytest.fixture
def rs(tmp_path):
    with rockstate.open(str(tmp_path / "db"), partitions=4) as handle:
        yield handle


KINDS = {
    "uuid": [str(uuid.UUID(int=i * 104729)) for i in range(400)],
    "shared prefix": [f"order-{i:012d}" for i in np.random.default_rng(1).permutation(400)],
    "tuple": [("tenant-%d" % (i % 3), i) for i in range(400)],
    "int": [int(i) for i in np.random.default_rng(2).permutation(400) - 200],
}


@pytest.mark.parametrize("kind", KINDS)
def test_each_partitions_keys_go_in_key_order_and_a_repeated_key_keeps_its_place(kind):
    keys = KINDS[kind] + KINDS[kind][:10]  # the first ten again, later
    encoded, pids = prepare_keys(keys, 4, 1 << 16)
    order, groups = write_order(pids, encoded)
    assert sorted(order.tolist()) == list(range(len(keys)))
    assert [pid for pid, _, _ in groups] == sorted({int(p) for p in pids})
    for pid, a, b in groups:
        rows = order[a:b].tolist()
        assert all(pids[i] == pid for i in rows)
        heads = [encoded[i][:16] for i in rows]
        assert heads == sorted(heads)  # RocksDB's order (bytes) within the partition, by the first 16 bytes
        for i, j in zip(rows, rows[1:]):
            if encoded[i] == encoded[j]:
                assert i < j  # stable: a key's later value is written after its earlier one


def test_short_runs_keep_their_given_order():
    keys = [str(uuid.UUID(int=i)).encode() for i in range(40)]
    pids = np.arange(40) % 10  # 4 keys a partition, below SORTED_FROM
    assert len(keys) < SORTED_FROM * 10
    order, groups = write_order(pids, keys)
    assert order.tolist() == np.argsort(pids, kind="stable").tolist() and len(groups) == 10


SHAPES = {
    "dict": lambda keys, values: ((dict(zip(keys, values)),), {}),
    "pairs": lambda keys, values: ((list(zip(keys, values)),), {}),
    "lists": lambda keys, values: ((keys, values), {}),
    "numpy": lambda keys, values: ((np.array(keys, dtype=object), np.array(values, dtype=object)), {}),
    "pandas": lambda keys, values: ((pd.Series(values, index=keys),), {}),
    "arrow": lambda keys, values: ((pa.array(keys), pa.array(values)), {}),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_a_batch_put_leaves_every_keys_last_value_whatever_its_shape(rs, shape):
    keys = KINDS["uuid"] + KINDS["uuid"][:50]  # 100 keys a partition: in key order
    values = [f"{i}@{dt.datetime(2026, 11, 28, i % 24)}" for i in range(len(keys))]
    if shape == "dict":  # a dict holds each key once: its last value
        values = values[:len(KINDS["uuid"])]
        keys = KINDS["uuid"]
        values[:50] = [f"{400 + i}@again" for i in range(50)]
    state = rs.value_state("order_" + shape)
    args, kwargs = SHAPES[shape](keys, values)
    state.put_many(*args, **kwargs)
    expected = dict(zip(keys, values))
    assert state.get_many(list(expected)) == list(expected.values())
    assert state.count() == len(KINDS["uuid"])
