"""bulk_load on real Spark into the package's 2-node cluster: sorted SST files ingested by the owners."""

import dataclasses

import numpy as np
import pyarrow as pa
import pytest
from pyspark.errors import PythonException
from pyspark.sql import functions as F

from rockstate import partition_of
from rockstate.cluster.client.bulk import write_sst
from rockstate.errors import InvalidInputError, InvalidKeyError, InvalidValueError, StateKindError, UnknownStateError
from rockstate.serde import _pack, decode_value
from rockstate.spark import BulkLoadResult, StateClientSpec, bulk_load
from rockstate.spark.bulk import _int_order, _LoadTask

from .conftest import PARTITIONS
from rockstate.testing.cluster import gen_cluster

N = 50_000


def test_int_order_is_the_bytewise_order_of_msgpack():
    rng = np.random.default_rng(5)
    edges = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1,
             -1, -32, -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1, -(2**63)]
    values = np.concatenate([np.array(edges, dtype=np.int64), rng.integers(-(2**63), 2**63 - 1, 3000, dtype=np.int64),
                             rng.integers(-70_000, 70_000, 3000)])
    encoded = [_pack(v) for v in values.tolist()]
    assert [encoded[i] for i in _int_order(values).tolist()] == sorted(encoded)


def test_bulk_load_value_state(spark, rs):
    df = spark.range(N).select((F.col("id") * 7919 % 1_000_003 - 500_000).alias("k"),  # negatives, every msgpack int width
                               F.struct((F.col("id") % 10).alias("n"), F.concat(F.lit("v"), F.col("id").cast("string")).alias("s")).alias("v"))
    result = bulk_load(df, "bulk-values", "k", "v", rs)
    assert isinstance(result, BulkLoadResult)
    assert (result.rows, result.partitions, result.files) == (N, PARTITIONS, PARTITIONS)  # one file per partition
    assert result.bytes > 0 and result.keys_per_second > 0
    keys = [i * 7919 % 1_000_003 - 500_000 for i in range(N)]
    expected = [{"n": i % 10, "s": f"v{i}"} for i in range(N)]
    assert rs.value_state("bulk-values").get_many(keys) == expected
    assert rs.value_state("bulk-values").count() == N

    # without the shuffle: each of the DataFrame's 3 tasks writes a file per partition it has rows of
    result = bulk_load(df.repartition(3), "bulk-values-no-shuffle", "k", "v", rs, shuffle=False)
    assert (result.rows, result.partitions, result.files) == (N, PARTITIONS, 3 * PARTITIONS)
    assert rs.value_state("bulk-values-no-shuffle").get_many(keys) == expected


def test_bulk_load_overwrites_like_put_many(spark, rs):
    state = rs.value_state("bulk-upsert")
    state.put_many({i: "old" for i in range(0, 2000, 2)})  # even keys: some get overwritten, some kept
    state.put("kept", "old")
    bulk_load(spark.range(1000).select(F.col("id").alias("k"), F.lit("new").alias("v")), "bulk-upsert", "k", "v", rs)
    assert state.get_many(range(2000)) == ["new"] * 1000 + ["old" if i % 2 == 0 else None for i in range(1000, 2000)]
    assert state.get("kept") == "old"


def test_bulk_load_tuple_keys_and_nested_values(spark, rs):
    rows = [(f"user-{i % 300}", i // 300, None if i % 7 == 0 else [i, i + 1], {"a": i}, b"\x00\xff" * (i % 3)) for i in range(3000)]
    df = spark.createDataFrame(rows, "user string, day long, items array<long>, m map<string,long>, raw binary")
    df = df.select("user", "day", F.struct("items", "m", "raw").alias("v"))
    bulk_load(df, "bulk-tuples", ["user", "day"], "v", rs.backend.address)  # the coordinator address works too
    got = rs.value_state("bulk-tuples").get_many([(u, d) for u, d, *_ in rows])
    assert got == [{"items": items, "m": m, "raw": raw} for _, _, items, m, raw in rows]


def test_bulk_load_map_state(spark, rs):
    df = spark.range(6000).select((F.col("id") % 500).alias("cart"), F.concat(F.lit("item-"), (F.col("id") / 500).cast("int").cast("string")).alias("item"),
                                  (F.col("id") * 2).alias("qty"))
    result = bulk_load(df, "bulk-carts", "cart", "qty", rs, user_key="item")
    assert result.rows == 6000
    carts = rs.map_state("bulk-carts")
    assert dict(carts.items(7)) == {f"item-{j}": (7 + 500 * j) * 2 for j in range(12)}
    assert carts.count() == 6000


def test_bulk_load_ttl_state(spark, rs):
    state = rs.value_state("bulk-ttl", ttl=3600)
    bulk_load(spark.range(100).select(F.col("id").alias("k"), F.col("id").alias("v")), "bulk-ttl", "k", "v", rs, ttl=3600)
    assert state.get_many(range(100)) == list(range(100))
    with pytest.raises(StateKindError):  # the state's TTL is part of its definition
        bulk_load(spark.range(1).select(F.col("id").alias("k"), F.col("id").alias("v")), "bulk-ttl", "k", "v", rs)


def test_bulk_load_duplicates(spark, rs):
    df = spark.createDataFrame([(1, "a"), (2, "b"), (1, "c")], "k long, v string")
    with pytest.raises(PythonException, match="the key 1 more than once"):
        bulk_load(df, "bulk-dups", "k", "v", rs)
    assert rs.value_state("bulk-dups").get(2) in (None, "b")  # other partitions may have been ingested
    bulk_load(df, "bulk-dups", "k", "v", rs, duplicates="last")
    assert rs.value_state("bulk-dups").get(1) in ("a", "c") and rs.value_state("bulk-dups").get(2) == "b"


@pytest.mark.parametrize("user_key", [None, "uk"])
def test_duplicates_are_found_in_any_key_type(user_key):
    rows = pa.table({"k": ["x", "y", "x"], "uk": [1, 1, 1], "v": [1, 2, 3]})
    task = _LoadTask(StateClientSpec("127.0.0.1:1"), "s", ["k"], "v", user_key, None, "error", 1 << 20, 1 << 20)
    with pytest.raises(InvalidInputError, match=r"the (key 'x'|\(key, user_key\) \('x', 1\)) more than once"):
        task._entries(rows)
    last = dataclasses.replace(task, duplicates="last")
    keys, values = last._entries(rows)
    assert [decode_value(v) for v in values] == [3, 2]  # in key order, the last "x" kept


def test_bulk_load_refuses_bad_input(spark, rs):
    df = spark.range(3).select(F.col("id").alias("k"), F.current_timestamp().alias("ts"))
    with pytest.raises(InvalidValueError, match="timestamp"):
        bulk_load(df, "bulk-bad", "k", "ts", rs)
    with pytest.raises(InvalidInputError, match="not in the DataFrame"):
        bulk_load(df, "bulk-bad", "k", "nope", rs)
    with pytest.raises(InvalidInputError, match="duplicates"):
        bulk_load(df, "bulk-bad", "k", "ts", rs, duplicates="first")
    with pytest.raises(InvalidKeyError, match="timestamp"):
        bulk_load(df, "bulk-bad", "ts", "k", rs, shuffle=False)


@gen_cluster(nodes=1, partitions=4, root="{tmp_path}/cluster")
def test_ingest_follows_a_moved_partition(cluster, tmp_path):
    """A client routing by a stale table gets NOT_OWNER for moved partitions, refreshes and uploads again."""
    with cluster.connect() as handle:
        state = handle.value_state("moved", create=True)  # raw SST ingests below go to it
        backend = handle.backend
        stale = backend.table.epoch
        cluster.add_node()  # half of the partitions move to the new node
        keys = list(range(2000))
        for pid in range(4):
            mine = sorted((_pack(k) for k in keys if partition_of(k, 4) == pid))
            path = str(tmp_path / f"p{pid}.sst")
            write_sst(path, mine, [_pack(f"v{decode_value(k)}") for k in mine])
            assert backend.ingest_sst("moved", pid, path) > 0
        assert backend.table.epoch > stale
        assert state.get_many(keys) == [f"v{k}" for k in keys]
        with pytest.raises(UnknownStateError):
            backend.ingest_sst("never-defined", 0, path)
