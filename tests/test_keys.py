"""Unit tests of the Spark-identical partitioner (no Spark here; see test_keys_spark.py)."""

import math
import random
import struct
import uuid

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from rockstate.errors import ConfigError, InvalidInputError, InvalidKeyError
from rockstate.keys import check_key, partition_of, partitions_of, spark_hash

P = 2**31 - 1  # the largest int partition count: pmod by it keeps almost the whole hash

# Spark SQL `hash(...)` of these keys, as printed by Spark 4.0.1 (`select hash(1L), ...`).
SPARK_HASHES = [
    (1, -1712319331),
    (0, -1670924195),
    (-1, -939490007),
    (42, 1316951768),
    (2**63 - 1, -1604625029),
    (-(2**63), -853646085),
    (2**31, 238268309),
    ("", 142593372),
    ("a", 1485273170),
    ("ab", -97053317),
    ("abc", 1322437556),
    ("abcd", -396302900),
    ("abcde", 814637928),
    ("é", 2119106806),
    ("日本", -336983209),
    ("😀", 1877935379),
    ("a😀", -887235657),
    (True, -559580957),
    (False, 933211791),
    (0.0, -1670924195),  # double 0.0 has the bits of bigint 0
    (-0.0, -1670924195),  # Spark hashes -0.0 as 0.0
    (1.0, -460888942),
    (-1.5, 2099784398),
    (math.nan, -1281358385),
    (math.inf, 833680482),
    (-math.inf, 461104036),
    (5e-324, -1712319331),  # bits 1, so the hash of bigint 1
    (b"", 142593372),
    (b"\xff", 1398487324),
    (b"\x80\x00\x7f", -77720607),
    (b"\xde\xad\xbe\xef\x01", 485169678),
    ((1, "a"), 573093329),
    ((None, "a"), 1485273170),  # a null column leaves the running hash as it was
    (("a", None), 1485273170),
    (("k", 7, 2.5), 2047860156),
    ((True, b"\xff", -3), 78666813),
    (None, 42),
]


@pytest.mark.parametrize("key,expected", SPARK_HASHES, ids=[repr(k) for k, _ in SPARK_HASHES])
def test_spark_hash_matches_spark(key, expected):
    assert spark_hash(key) == expected
    assert partition_of(key, 128) == expected % 128
    columns = [[c] for c in key] if isinstance(key, tuple) else [key]
    assert partitions_of(columns, 128).tolist() == [expected % 128]


def test_nan_payloads_and_negative_nan_hash_as_nan():
    other_nan = struct.unpack("<d", struct.pack("<Q", 0xFFF0000000000123))[0]
    assert math.isnan(other_nan)
    assert spark_hash(other_nan) == spark_hash(-math.nan) == -1281358385
    assert partitions_of(np.array([other_nan, -0.0]), 2**31 - 1).tolist() == [-1281358385 % P, -1670924195 % P]


def test_numpy_scalars_hash_like_python_values():
    assert spark_hash(np.int64(7)) == spark_hash(np.int8(7)) == spark_hash(np.uint32(7)) == spark_hash(7)
    assert spark_hash(np.float64(2.5)) == spark_hash(np.float32(2.5)) == spark_hash(2.5)
    assert spark_hash(np.bool_(True)) == spark_hash(True) != spark_hash(1)
    assert spark_hash(np.str_("abc")) == spark_hash("abc") == spark_hash(b"abc") == spark_hash(bytearray(b"abc"))


@pytest.mark.parametrize(
    "key,type_name",
    [([1], "list"), ({"a": 1}, "dict"), ({1}, "set"), (object(), "object"), (frozenset(), "frozenset"), (1j, "complex")],
)
def test_unsupported_types_name_the_type(key, type_name):
    for bad in (key, (1, key)):
        with pytest.raises(InvalidKeyError, match=f"'{type_name}'.*a key is None, bool, int"):
            check_key(bad)
        with pytest.raises(InvalidKeyError, match=type_name):
            partition_of(bad, 8)
    with pytest.raises(InvalidKeyError, match=type_name):
        partitions_of([1, key], 8)


def test_tuples_must_be_flat_and_non_empty():
    for bad in [(), ((1, 2),), (1, (2,))]:
        with pytest.raises(InvalidKeyError, match="tuple"):
            check_key(bad)
    check_key((1, "a", None, 2.5, True, b"x"))


def test_ints_outside_int64_are_refused():
    for bad in (2**63, -(2**63) - 1, 10**30):
        with pytest.raises(InvalidKeyError, match=r"signed 64-bit range \[-9223372036854775808, 9223372036854775807\]"):
            partition_of(bad, 8)
        with pytest.raises(InvalidKeyError, match="64-bit"):
            partitions_of([1, bad], 8)
    with pytest.raises(InvalidKeyError, match="64-bit"):
        partitions_of(np.array([2**64 - 1], dtype=np.uint64), 8)
    with pytest.raises(InvalidKeyError, match="64-bit"):
        partitions_of(pa.array([2**64 - 1], type=pa.uint64()), 8)
    assert partitions_of(np.array([2**63 - 1], dtype=np.uint64), 8).tolist() == [partition_of(2**63 - 1, 8)]


def test_bad_partition_counts_and_column_lengths():
    for bad in (0, -3, 2.0, True, None):
        with pytest.raises(ConfigError):
            partition_of(1, bad)
        with pytest.raises(ConfigError):
            partitions_of([1], bad)
    with pytest.raises(InvalidInputError, match="different lengths"):
        partitions_of([[1, 2], [1]], 8)
    with pytest.raises(InvalidKeyError, match="one-dimensional"):
        partitions_of(np.zeros((2, 2)), 8)
    with pytest.raises(InvalidKeyError, match="list<item: int64>"):
        partitions_of(pa.array([[1]]), 8)


# -- scalar path == vectorized path on random data --------------------------------

rng = random.Random(20240611)
ALPHABET = "abcXYZ 09_" + "éßñ" + "日本語" + "😀🚀"


def random_values(kind, n=3000, nulls=True):
    def one():
        if nulls and rng.random() < 0.1:
            return None
        if kind == "bigint":
            return rng.choice([rng.getrandbits(64) - 2**63, rng.randint(-1000, 1000), rng.getrandbits(32)])
        if kind == "double":
            return rng.choice([rng.uniform(-1e6, 1e6), struct.unpack("<d", rng.randbytes(8))[0], -0.0, math.nan])
        if kind == "boolean":
            return rng.random() < 0.5
        if kind == "string":
            return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 40)))
        return rng.randbytes(rng.randint(0, 40))  # binary

    return [one() for _ in range(n)]


ARROW_TYPES = {"bigint": pa.int64(), "double": pa.float64(), "boolean": pa.bool_(), "string": pa.string(), "binary": pa.binary()}
KINDS = list(ARROW_TYPES)


def expected(keys):
    return [partition_of(k, P) for k in keys]


@pytest.mark.parametrize("kind", KINDS)
def test_vectorized_equals_scalar(kind):
    values = random_values(kind)
    want = expected(values)
    arrow = pa.array(values, type=ARROW_TYPES[kind])
    assert partitions_of(values, P).tolist() == want
    assert partitions_of(arrow, P).tolist() == want
    assert partitions_of(np.array(values, dtype=object), P).tolist() == want
    chunked = pa.chunked_array([arrow.slice(0, 1000), arrow.slice(1000)])
    assert partitions_of(chunked, P).tolist() == want
    assert partitions_of(arrow.slice(7, 100), P).tolist() == want[7:107]  # a slice has an offset into its buffers
    dense = [v for v in values if v is not None]
    dense_want = expected(dense)
    numpy_type = {"bigint": np.int64, "double": np.float64, "boolean": bool, "string": str, "binary": object}[kind]
    assert partitions_of(np.array(dense, dtype=numpy_type), P).tolist() == dense_want
    assert partitions_of(pd.Series(dense), P).tolist() == dense_want  # (pandas turns None in numbers into NaN)


def test_vectorized_large_arrow_types_and_narrow_ints():
    strings = random_values("string")
    assert partitions_of(pa.array(strings, type=pa.large_string()), P).tolist() == expected(strings)
    blobs = random_values("binary")
    assert partitions_of(pa.array(blobs, type=pa.large_binary()), P).tolist() == expected(blobs)
    ints = list(range(-128, 128))
    want = expected(ints)
    for dtype in (np.int8, np.int16, np.int32):
        assert partitions_of(np.array(ints, dtype=dtype), P).tolist() == want
        assert partitions_of(pa.array(ints, type=pa.from_numpy_dtype(dtype)), P).tolist() == want
    unsigned = list(range(256))
    assert partitions_of(np.array(unsigned, dtype=np.uint8), P).tolist() == expected(unsigned)
    assert partitions_of(pa.array([0.5, None, -0.0], type=pa.float32()), P).tolist() == expected([0.5, None, 0.0])


def test_one_long_string_among_short_ones():
    values = ["x" * 10_001, "", "abcdefg", "é" * 999, None, "q"]
    assert partitions_of(values, P).tolist() == expected(values)
    assert partitions_of(pa.array(values), P).tolist() == expected(values)


def test_mixed_object_column_goes_row_by_row():
    values = [1, "a", 2.5, True, None, b"x", np.int32(3), bytearray(b"yz")]
    assert partitions_of(values, P).tolist() == expected(values)
    assert partitions_of(np.array(values, dtype=object), P).tolist() == expected(values)


def test_all_null_columns():
    assert partitions_of([None, None], P).tolist() == [42, 42]
    assert partitions_of(pa.nulls(2), P).tolist() == [42, 42]
    assert partitions_of([pa.nulls(2), pa.array(["a", None])], P).tolist() == expected([(None, "a"), (None, None)])


@pytest.mark.parametrize("kinds", [("bigint", "string"), ("string", "bigint", "double"), ("boolean", "binary", "bigint")])
def test_tuples_vectorized_equals_scalar(kinds):
    columns = [random_values(kind) for kind in kinds]
    keys = list(zip(*columns))
    want = expected(keys)
    assert partitions_of(columns, P).tolist() == want
    assert partitions_of(tuple(pa.array(c, type=ARROW_TYPES[k]) for c, k in zip(columns, kinds)), P).tolist() == want
    for parts in (128, 7, 1):
        assert partitions_of(columns, parts).tolist() == [partition_of(k, parts) for k in keys]


def test_empty_input():
    assert partitions_of([], 8).tolist() == []
    assert partitions_of([np.array([], dtype=np.int64), pa.array([], type=pa.string())], 8).tolist() == []


# -- keys without tail bytes, hashed in C (mmh3) ------------------------------------


def reference_hash(key) -> int:
    """Spark's hashUnsafeBytes block by block in Python (scalar.py's helpers), whatever the length."""
    from rockstate.keys.scalar import SEED, _fmix, _mix, _signed

    data = key.encode() if isinstance(key, str) else key
    aligned = len(data) & ~3
    h = SEED
    for word in struct.unpack_from(f"<{aligned >> 2}I", data):
        h = _mix(h, word)
    for byte in data[aligned:]:
        h = _mix(h, (byte - 256 if byte > 127 else byte) & 0xFFFFFFFF)
    return _signed(_fmix(h, len(data)))


def test_untailed_keys_hash_in_c_as_the_reference():
    """Keys whose UTF-8 length is a multiple of 4 (UUIDs, most fixed-width ids) go through mmh3, one at a time
    and column-wise (prepare_keys of str or bytes keys); the rest through the numpy or Python path. All agree."""
    from rockstate.keys import partitions_of_packed
    from rockstate.serde import encode_keys

    uuids = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(400)]
    ids = [f"order-{i:06d}" for i in range(100)] + ["😀", "éé", "abcd" * 9, ""]  # order-000001: 12 characters
    blobs = [rng.randbytes(4 * rng.randint(0, 10)) for _ in range(200)]
    tailed = ["abc", "日本", "order-12345"]
    for keys in (uuids, ids, blobs, uuids + tailed, ["日本語x"] * 3, uuids + blobs):
        want = [reference_hash(k) for k in keys]
        assert [spark_hash(k) for k in keys] == want
        if len(set(map(type, keys))) == 1:
            encoded = encode_keys(keys)
            assert partitions_of_packed(encoded, P, keys).tolist() == partitions_of_packed(encoded, P).tolist() == [h % P for h in want]
    # in a tuple, a UUID column after an int column: mmh3 seeded by the running hash (the numpy path agrees)
    assert partitions_of([list(range(400)), uuids], P).tolist() == [partition_of((i, k), P) for i, k in enumerate(uuids)]
