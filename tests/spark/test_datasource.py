"""spark.read.format("rockstate"): a state of a checkpoint as a DataFrame, read from the checkpoint storage."""

import base64
import json
import time

import pytest
from pyspark.errors import AnalysisException, PythonException
from pyspark.sql import functions as F

from rockstate import LocalCluster, partition_of
from rockstate.spark import SPARK_VERSION, bulk_load, register_data_source

if SPARK_VERSION < (4, 0):
    pytest.skip("the Python Data Source API is Spark 4.0+", allow_module_level=True)

N = 50_000
P = 4


@pytest.fixture(scope="module")
def chk_cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("datasource")
    with LocalCluster(nodes=2, partitions=P, root=str(root / "cluster"), checkpoints=f"file://{root}/chk") as c:
        c.url = f"file://{root}/chk"
        yield c


@pytest.fixture(scope="module")
def crs(chk_cluster):
    with chk_cluster.connect() as handle:
        yield handle


@pytest.fixture(scope="module")
def read(spark, chk_cluster):
    register_data_source(spark)

    def make(state, schema=None, **options):
        reader = spark.read.format("rockstate").option("url", chk_cluster.url).option("state", state)
        for name, value in options.items():
            reader = reader.option(name, value)
        return (reader.schema(schema) if schema else reader).load()

    return make


def test_bulk_loaded_data_reads_back_unchanged(spark, crs, read, chk_cluster):
    ids = F.col("id")
    df = spark.range(N).select((ids * 104_729 % 2_000_003 - 1_000_000).alias("k"),
                               F.struct(F.concat(F.lit("value-"), ids.cast("string")).alias("s"), (ids % 97).alias("n")).alias("v"))
    assert bulk_load(df, "ds-values", "k", "v", crs).rows == N
    expected = {i * 104_729 % 2_000_003 - 1_000_000: {"s": f"value-{i}", "n": i % 97} for i in range(N)}
    assert crs.value_state("ds-values").get_many(list(expected)) == list(expected.values())
    crs.checkpoint()

    typed = read("ds-values", "key long, value struct<s: string, n: long>, partition int").toArrow().to_pylist()
    assert len(typed) == N
    assert {r["key"]: r["value"] for r in typed} == expected
    assert all(r["partition"] == partition_of(r["key"], P) for r in typed)

    default = read("ds-values")  # key, value, partition: keys and values as JSON
    assert default.columns == ["key", "value", "partition"]
    # one Spark partition per node's checkpoint (its files fetched once for all its partitions)
    assert default.rdd.getNumPartitions() == len(chk_cluster.nodes()) == 2
    got = {json.loads(r["key"]): (json.loads(r["value"]), r["partition"]) for r in default.toArrow().to_pylist()}
    assert got == {k: (v, partition_of(k, P)) for k, v in expected.items()}


def test_map_state_has_user_key(spark, crs, read):
    carts = crs.map_state("ds-carts")
    carts.put_all("alice", {"book": 2, "pen": 1})
    carts.put_all(("bob", 7), {3: [1, 2], b"\x01": None})
    bulk_load(spark.createDataFrame([("carol", "mug", 5)], "c string, item string, qty long"), "ds-carts", "c", "qty", crs, user_key="item")
    crs.checkpoint()
    df = read("ds-carts")
    assert df.columns == ["key", "user_key", "value", "partition"]
    got = {(r.key, r.user_key, r.value, r.partition) for r in df.collect()}
    # a string column holds a str as it is, anything else as JSON (None as null)
    assert got == {
        ("alice", "book", "2", partition_of("alice", P)),
        ("alice", "pen", "1", partition_of("alice", P)),
        ('["bob",7]', "3", "[1,2]", partition_of(("bob", 7), P)),
        ('["bob",7]', '{"$base64":"' + base64.b64encode(b"\x01").decode() + '"}', None, partition_of(("bob", 7), P)),
        ("carol", "mug", "5", partition_of("carol", P)),
    }
    as_json = {(r.key, r.user_key) for r in read("ds-carts", json="true").collect()}
    assert ('"alice"', '"book"') in as_json  # json=true: strs quoted too, every cell parses
    some = read("ds-carts", "value string, user_key string", checkpoint=str(crs.checkpoints()[-1].checkpoint_id))
    assert {(r.user_key, r.value) for r in some.collect()} == {(uk, v) for _, uk, v, _ in got}  # any columns, any order


def test_checkpoint_and_savepoint_options(crs, read):
    state = crs.value_state("ds-versions")
    state.put("k", 1)
    first = crs.checkpoint().checkpoint_id
    crs.savepoint("ds-first", first)
    state.put("k", 2)
    crs.checkpoint()
    assert [r.value for r in read("ds-versions").collect()] == ["2"]  # the latest completed checkpoint
    assert [r.value for r in read("ds-versions", checkpoint=str(first)).collect()] == ["1"]
    assert [r.value for r in read("ds-versions", savepoint="ds-first").collect()] == ["1"]


def test_list_and_ttl_states(crs, read):
    crs.list_state("ds-lists").extend("k", ["a", "b"])
    crs.list_state("ds-lists").extend(2, ["a", 1, None])
    crs.list_state("ds-str-lists").extend("k", ["a", "b"])
    ttl = crs.value_state("ds-ttl", ttl=3600)
    ttl.put("k", "v")
    short = crs.value_state("ds-short", ttl=0.5)
    short.put("gone", 1)
    crs.checkpoint()
    assert {(r.key, r.value) for r in read("ds-lists").collect()} == {("k", '["a","b"]'), ("2", '["a",1,null]')}
    typed = read("ds-str-lists", "key string, value array<string>").collect()
    assert [(r.key, r.value) for r in typed] == [("k", ["a", "b"])]
    [row] = read("ds-ttl", "key string, value string, expires_at timestamp").collect()
    expires = row.expires_at.timestamp()  # Spark gives a naive datetime in local time
    assert (row.key, row.value) == ("k", "v") and time.time() + 3500 < expires < time.time() + 3700
    time.sleep(0.6)
    assert read("ds-short").count() == 0  # expired at read time


def test_errors_name_what_is_wrong(crs, read):
    crs.value_state("ds-ints").put(1, "one")
    crs.checkpoint()
    with pytest.raises(AnalysisException, match="no state 'nope'"):
        read("nope").collect()
    with pytest.raises(Exception, match="user_key"):
        read("ds-ints", "key long, user_key string").collect()
    with pytest.raises(PythonException, match="column 'value' is bigint"):
        read("ds-ints", "key long, value long").collect()
