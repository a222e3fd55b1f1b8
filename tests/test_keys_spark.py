"""The partitioner against a real local Spark: pmod(hash(cols...), P) computed by Spark SQL."""

import math
import os
import random
import struct
import sys

import pyarrow as pa
import pytest

from rockstate.keys import partition_of, partitions_of, spark_hash

pyspark = pytest.importorskip("pyspark")
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql import types as T  # noqa: E402

N = 10_000
PARTITIONS = (128, 7, 1)
rng = random.Random(4242)


@pytest.fixture(scope="module")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    session = (
        SparkSession.builder.master("local[1]")
        .appName("rockstate-test-keys")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    yield session
    session.stop()


# -- key generators: edge cases first, then random values, ~5% nulls ------------

INT64_EDGES = [0, 1, -1, 2**63 - 1, -(2**63), 2**31 - 1, -(2**31), 2**31, 2**32, -(2**32), 255, -128]
DOUBLE_EDGES = [0.0, -0.0, math.nan, -math.nan, math.inf, -math.inf, 5e-324, -5e-324, 2.2250738585072014e-308,
                1.7976931348623157e308, -1.7976931348623157e308, 1.0, -1.0, 0.1, 1e-300, 1e300]  # fmt: skip
CHARS = "abcxyzABCXYZ0189 _-" + "éüßñ€" + "日本語中" + "😀🚀𝄞"
ASCII = "abcdefghijklmnopqrstuvwxyz0123456789ABCD"
STRING_EDGES = ["é", "€", "日本語", "😀", "a😀", "😀😀😀", "\x00", "a\x00b"] + [ASCII[:n] for n in range(41)]  # every length 0..40
BINARY_EDGES = [b"", b"\x00", b"\xff", b"\x80", b"\x7f", b"\xff\xfe\xfd", b"\x80\x81\x82\x83\x84"]


def _bigint():
    return rng.choice([rng.getrandbits(64) - 2**63, rng.randint(-100_000, 100_000), rng.getrandbits(31)])


def _double():
    return rng.choice([rng.uniform(-1e9, 1e9), struct.unpack("<d", rng.randbytes(8))[0], rng.gauss(0, 1) * 1e-310])


def _string():
    return "".join(rng.choice(CHARS) for _ in range(rng.randint(0, 40)))


GENERATORS = {
    "bigint": (T.LongType(), _bigint, INT64_EDGES),
    "double": (T.DoubleType(), _double, DOUBLE_EDGES),
    "boolean": (T.BooleanType(), lambda: rng.random() < 0.5, [True, False]),
    "string": (T.StringType(), _string, STRING_EDGES),
    "binary": (T.BinaryType(), lambda: rng.randbytes(rng.randint(0, 40)), BINARY_EDGES),
}


def column(kind, n=N):
    _, make, edges = GENERATORS[kind]
    return edges + [None] + [None if rng.random() < 0.05 else make() for _ in range(n - len(edges) - 1)]


def spark_partitions(spark, kinds, columns):
    """Spark's hash(cols...) and pmod(hash(cols...), P) per row, in row order."""
    schema = T.StructType(
        [T.StructField("id", T.LongType(), False)]
        + [T.StructField(f"c{i}", GENERATORS[k][0], True) for i, k in enumerate(kinds)]
    )
    rows = [(i, *vals) for i, vals in enumerate(zip(*columns))]
    df = spark.createDataFrame(rows, schema)
    h = F.hash(*[F.col(f"c{i}") for i in range(len(kinds))])
    out = df.select("id", h.alias("h"), *[F.pmod(h, F.lit(p)).alias(f"p{p}") for p in PARTITIONS])
    collected = sorted(out.collect(), key=lambda r: r["id"])  # consume every computed column
    assert [r["id"] for r in collected] == list(range(len(rows)))
    return df, [r["h"] for r in collected], {p: [r[f"p{p}"] for r in collected] for p in PARTITIONS}


GROUPS = [("bigint",), ("double",), ("boolean",), ("string",), ("binary",),
          ("bigint", "string"), ("string", "bigint", "double"), ("boolean", "binary", "bigint", "double")]  # fmt: skip


@pytest.mark.parametrize("kinds", GROUPS, ids=["-".join(g) for g in GROUPS])
def test_partitioner_matches_spark(spark, kinds):
    columns = [column(k) for k in kinds]
    if len(kinds) > 1:  # make sure some rows are null in every column at once
        for col in columns:
            col[-1] = None
    keys = list(zip(*columns)) if len(kinds) > 1 else columns[0]
    df, hashes, parts = spark_partitions(spark, kinds, columns)

    assert [spark_hash(k) for k in keys] == hashes
    arrow = df.drop("id").toArrow()  # the Arrow batches a mapInArrow task would see
    for p in PARTITIONS:
        assert [partition_of(k, p) for k in keys] == parts[p]
        assert partitions_of(columns, p).tolist() == parts[p]
        assert partitions_of(arrow.columns, p).tolist() == parts[p]
    if len(kinds) == 1:  # one column on its own, not wrapped in a list
        assert partitions_of(pa.array(columns[0], type=arrow.schema.field(0).type), 128).tolist() == parts[128]
