"""The partitioner against a real local Spark: pmod(hash(cols...), P) computed by Spark SQL."""

import datetime as dt
import math
import os
import random
import struct
import sys
import uuid
from decimal import Decimal

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
        .config("spark.sql.session.timeZone", "UTC")
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


UTC = dt.timezone.utc
EPOCH = dt.datetime(1970, 1, 1)
TIMESTAMP_EDGES = [EPOCH, EPOCH - dt.timedelta(microseconds=1), dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
                   dt.datetime(2024, 2, 29, 12, 0, 0, 1), dt.datetime(1900, 3, 1)]  # fmt: skip
DATE_EDGES = [dt.date(1970, 1, 1), dt.date(1969, 12, 31), dt.date(1, 1, 1), dt.date(9999, 12, 31), dt.date(2024, 2, 29)]
DECIMAL18_EDGES = [Decimal("0.00"), Decimal("-0.01"), Decimal("9999999999999999.99"), Decimal("-9999999999999999.99"), Decimal("1.50")]
DECIMAL38_EDGES = [Decimal("1" * 19 + ".00"), Decimal("-" + "9" * 36 + ".99"), Decimal("1" + "0" * 18 + ".00"),
                   Decimal("-1" + "0" * 18 + ".00"), Decimal("12345678901234567890123.45")]  # fmt: skip


def _timestamp():
    return EPOCH + dt.timedelta(microseconds=rng.randint(-62_135_596_800_000_000, 253_402_300_799_999_999))


def _decimal(digits_from, digits_to):
    digits = rng.randint(digits_from, digits_to)
    return Decimal(f"{rng.choice([-1, 1]) * rng.randrange(10 ** (digits - 1), 10**digits)}E-2")  # scale 2, as the column's


GENERATORS = {
    "bigint": (T.LongType(), _bigint, INT64_EDGES),
    "double": (T.DoubleType(), _double, DOUBLE_EDGES),
    "boolean": (T.BooleanType(), lambda: rng.random() < 0.5, [True, False]),
    "string": (T.StringType(), _string, STRING_EDGES),
    "binary": (T.BinaryType(), lambda: rng.randbytes(rng.randint(0, 40)), BINARY_EDGES),
    # an aware datetime is Spark's timestamp, a naive one its timestamp_ntz
    "timestamp": (T.TimestampType(), lambda: _timestamp().replace(tzinfo=UTC), [t.replace(tzinfo=UTC) for t in TIMESTAMP_EDGES]),
    "timestamp_ntz": (T.TimestampNTZType(), _timestamp, TIMESTAMP_EDGES),
    "date": (T.DateType(), lambda: _timestamp().date(), DATE_EDGES),
    "interval": (T.DayTimeIntervalType(), lambda: dt.timedelta(microseconds=rng.randint(-(2**62), 2**62)),
                 [dt.timedelta(0), dt.timedelta(microseconds=-1), dt.timedelta(days=-1), dt.timedelta(days=999_999)]),
    # decimal(p<=18, 2): any value; decimal(38, 2): values of more than 18 digits (see keys.py)
    "decimal18": (T.DecimalType(18, 2), lambda: _decimal(1, 18), DECIMAL18_EDGES),
    "decimal38": (T.DecimalType(38, 2), lambda: _decimal(19, 38), DECIMAL38_EDGES),
    # a UUID key is its 36-character string: Spark's string column of str(uuid)
    "uuid": (T.StringType(), lambda: uuid.UUID(int=rng.getrandbits(128)), [uuid.UUID(int=0), uuid.UUID(int=2**128 - 1)]),
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
    spark_columns = [[None if v is None else str(v) for v in col] if k == "uuid" else col for k, col in zip(kinds, columns)]
    rows = [(i, *vals) for i, vals in enumerate(zip(*spark_columns))]
    df = spark.createDataFrame(rows, schema)
    h = F.hash(*[F.col(f"c{i}") for i in range(len(kinds))])
    out = df.select("id", h.alias("h"), *[F.pmod(h, F.lit(p)).alias(f"p{p}") for p in PARTITIONS])
    collected = sorted(out.collect(), key=lambda r: r["id"])  # consume every computed column
    assert [r["id"] for r in collected] == list(range(len(rows)))
    return df, [r["h"] for r in collected], {p: [r[f"p{p}"] for r in collected] for p in PARTITIONS}


GROUPS = [("bigint",), ("double",), ("boolean",), ("string",), ("binary",),
          ("bigint", "string"), ("string", "bigint", "double"), ("boolean", "binary", "bigint", "double"),
          ("timestamp",), ("timestamp_ntz",), ("date",), ("interval",), ("decimal18",), ("decimal38",), ("uuid",),
          ("uuid", "timestamp", "decimal18"), ("string", "date")]  # fmt: skip


def to_arrow(df):
    """DataFrame.toArrow (Spark 4.0+); on 3.5 the batches it is made of."""
    if hasattr(df, "toArrow"):
        return df.toArrow()
    return pa.Table.from_batches(df._collect_as_arrow())


@pytest.mark.parametrize("kinds", GROUPS, ids=["-".join(g) for g in GROUPS])
def test_partitioner_matches_spark(spark, kinds):
    if "interval" in kinds and not hasattr(spark.range(1), "toArrow"):
        pytest.skip("Spark 3.5's Arrow export of day-time intervals fails in the JVM (IndexOutOfBoundsException)")
    columns = [column(k) for k in kinds]
    if len(kinds) > 1:  # make sure some rows are null in every column at once
        for col in columns:
            col[-1] = None
    keys = list(zip(*columns)) if len(kinds) > 1 else columns[0]
    df, hashes, parts = spark_partitions(spark, kinds, columns)

    assert [spark_hash(k) for k in keys] == hashes
    arrow = to_arrow(df.drop("id"))  # the Arrow batches a mapInArrow task would see
    for p in PARTITIONS:
        assert [partition_of(k, p) for k in keys] == parts[p]
        assert partitions_of(columns, p).tolist() == parts[p]
        assert partitions_of(arrow.columns, p).tolist() == parts[p]
    if len(kinds) == 1:  # one column on its own, not wrapped in a list
        values = [None if v is None else str(v) for v in columns[0]] if kinds == ("uuid",) else columns[0]
        assert partitions_of(pa.array(values, type=arrow.schema.field(0).type), 128).tolist() == parts[128]
