"""Keys and values as pipelines have them: every type and input shape, embedded and on a real cluster."""

import collections
import datetime as dt
import uuid
import zoneinfo
from decimal import Decimal

import msgpack
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import rockstate
from rockstate.local.cluster import LocalCluster
from rockstate.errors import ConfigError, InvalidInputError, InvalidKeyError, InvalidValueError, SizeLimitError
from rockstate.keys import partition_of, partitions_of
from rockstate.serde import decode_key, decode_value, decode_values, encode_key, encode_value

PARIS = zoneinfo.ZoneInfo("Europe/Paris")
UTC = dt.timezone.utc

# (value, what it decodes to): most decode to themselves
VALUES = [
    (dt.datetime(2024, 3, 31, 1, 59, 59, 999999), None),
    (dt.datetime(2024, 10, 27, 2, 30, tzinfo=PARIS), None),
    (dt.datetime(2024, 10, 27, 2, 30, fold=1, tzinfo=PARIS), None),
    (dt.datetime(1969, 12, 31, 23, 59, 59, 1, tzinfo=dt.timezone(dt.timedelta(hours=-5, minutes=-30))), None),
    (dt.datetime(1, 1, 1), None),
    (dt.datetime(9999, 12, 31, 23, 59, 59, 999999), None),
    (dt.date(1900, 2, 28), None),
    (dt.date(9999, 12, 31), None),
    (dt.time(0, 0), None),
    (dt.time(23, 59, 59, 999999, tzinfo=UTC), None),
    (dt.timedelta(days=-3, microseconds=5), None),
    (dt.timedelta.max, None),
    (dt.timedelta.min, None),
    (Decimal("-12.3400"), None),
    (Decimal("1E+30"), None),
    (Decimal("0.000000000000000000000000000000000001"), None),
    (uuid.UUID("12345678-1234-5678-1234-567812345678"), None),
    ((1, "a", (2.5, None)), None),
    ([1, (2, dt.date(2020, 1, 1))], None),
    ({"ts": dt.datetime(2020, 1, 1, tzinfo=UTC), "amount": Decimal("9.99"), "pair": (1, 2)}, None),
    (pd.Timestamp("2024-01-01 00:00:00.000000001"), None),
    (pd.Timestamp("2024-06-01 12:00:00.123456789", tz="America/New_York"), None),
    (pd.Timestamp("2024-06-01 12:00:00"), dt.datetime(2024, 6, 1, 12)),
    (pd.Timedelta(nanoseconds=1), None),
    (pd.NaT, None.__class__()),
    (np.int64(7), 7),
    (np.uint8(255), 255),
    (np.float32(0.5), 0.5),
    (np.bool_(True), True),
    (np.str_("s"), "s"),
    (np.bytes_(b"b"), b"b"),
    (np.datetime64("2024-01-01T00:00:00.123456"), dt.datetime(2024, 1, 1, 0, 0, 0, 123456)),
    (np.datetime64("2024-01-01T00:00:00.123456789"), pd.Timestamp("2024-01-01T00:00:00.123456789")),
    (np.timedelta64(5, "s"), dt.timedelta(seconds=5)),
    (np.datetime64("NaT"), None),
    (pa.scalar(dt.date(2020, 1, 1)), dt.date(2020, 1, 1)),
    (pa.scalar(Decimal("1.20")), Decimal("1.20")),
    (pa.scalar("x"), "x"),
]


def _same(got, want):
    """Equal, of the same type, and (datetimes) in the same zone."""
    assert got == want and type(got) is type(want), (got, want)
    if isinstance(want, (dt.datetime, dt.time)) and want.tzinfo is not None:
        assert str(got.tzinfo) == str(want.tzinfo) and got.utcoffset() == want.utcoffset()


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    with rockstate.open(str(tmp_path_factory.mktemp("db")), partitions=8) as rs:
        yield rs


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(nodes=1, partitions=8, root=str(tmp_path_factory.mktemp("cluster"))) as c:
        with c.connect() as rs:
            yield rs


@pytest.fixture(params=["embedded", "cluster"])
def rs(request):
    return request.getfixturevalue(request.param)


def test_values_of_every_type_round_trip(rs):
    s = rs.value_state("values")
    keys = [f"k{i}" for i in range(len(VALUES))]
    s.put_many(keys, [v for v, _ in VALUES])
    for (value, want), got in zip(VALUES, s.get_many(keys)):
        want = value if want is None else want
        if value is pd.NaT or (isinstance(value, np.datetime64) and np.isnat(value)):
            assert got is None
        else:
            _same(got, want)
    s.put("one", VALUES[1][0])
    _same(s.get("one"), VALUES[1][0])
    lst = rs.list_state("lists")
    lst.extend("k", [v for v, _ in VALUES[:20]])
    for (value, _), got in zip(VALUES[:20], lst.get("k")):
        _same(got, value)


def test_a_batch_with_absent_keys_gets_each_value_in_its_place(rs):
    s = rs.value_state("holes")
    present = {f"k{i}": (i, dt.date(2024, 1, 1 + i % 28), Decimal(f"{i}.5")) for i in range(0, 300, 3)}
    s.put_many(present)
    keys = [f"k{i}" for i in range(300)]
    got = s.get_many(keys, default="absent")
    assert got == [present.get(k, "absent") for k in keys]
    assert all(type(v) is tuple for v in got if v != "absent")


def test_values_past_msgpacks_default_buffer_decode_as_one_page():
    """Stored values are decoded as one stream; msgpack's 100 MiB default buffer refused a larger page."""
    page = [msgpack.packb(bytes([i]) * (15 << 20)) for i in range(7)]  # 105 MiB of values under the 16 MiB limit
    assert [v[:1] for v in decode_values(page)] == [bytes([i]) for i in range(7)]
    got = decode_values(page[:3] + [None] + page[3:], default=b"")
    assert [len(v) for v in got] == [15 << 20] * 3 + [0] + [15 << 20] * 4
    assert [v[:1] for v in got] == [b"\x00", b"\x01", b"\x02", b"", b"\x03", b"\x04", b"\x05", b"\x06"]


KEYS = [
    dt.datetime(2024, 3, 31, 1, 59, 59, 999999),
    dt.datetime(2024, 3, 31, 1, 59, 59, 999999, tzinfo=UTC),
    dt.date(2024, 3, 31),
    dt.time(12, 30),
    dt.timedelta(hours=-1),
    Decimal("12.30"),
    Decimal("12.3"),
    Decimal("-123456789012345678901234.5"),
    uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "12345678-1234-5678-1234-567812345678",
    (dt.date(2024, 1, 1), "eu", Decimal("1.5")),
    ("user-1", uuid.UUID(int=1)),
]


def test_keys_of_every_type_are_distinct_and_round_trip(rs):
    """Decimal("12.30") and Decimal("12.3") are two keys, as decimal(4,2) and decimal(3,1) values are to Spark."""
    s = rs.value_state("keys")
    s.put_many(KEYS, range(len(KEYS)))
    assert s.get_many(KEYS) == list(range(len(KEYS)))
    assert [s.get(k) for k in KEYS] == list(range(len(KEYS)))
    assert sorted(map(repr, s.keys())) == sorted(map(repr, KEYS))
    assert s.count() == len(KEYS)


def test_an_aware_datetime_key_is_its_instant():
    paris = dt.datetime(2024, 6, 1, 14, 0, tzinfo=PARIS)
    utc = dt.datetime(2024, 6, 1, 12, 0, tzinfo=UTC)
    assert encode_key(paris) == encode_key(utc) == encode_key(pd.Timestamp(utc))
    assert partition_of(paris, 1000) == partition_of(utc, 1000)
    assert decode_key(encode_key(paris)) == utc


def test_scalars_of_numpy_pandas_and_arrow_are_the_python_keys(embedded):
    s = embedded.value_state("np-keys")
    s.put(np.int64(7), np.bool_(True))
    s.put(np.str_("seven"), np.float64(7.5))
    s.put(pa.scalar("arrow"), pa.scalar(3))
    s.put(np.datetime64("2024-01-01T00:00:00"), 1)
    assert s.get(7) is True and s.get("seven") == 7.5 and s.get("arrow") == 3
    assert s.get(dt.datetime(2024, 1, 1)) == 1
    assert s.get_many(np.arange(8, dtype=np.int32))[7] is True
    for scalar, plain in [(np.int64(7), 7), (np.str_("a"), "a"), (pa.scalar(2.5), 2.5), (np.datetime64("2024-01-01"), dt.datetime(2024, 1, 1))]:
        assert encode_key(scalar) == encode_key(plain)


def _shapes(keys, values):
    """Every form of (keys, values) a user has at hand."""
    frame = pd.DataFrame({"k": keys, "v": values})
    yield "mapping", (dict(zip(keys, values)),)
    yield "pairs", (list(zip(keys, values)),)
    yield "pairs generator", (((k, v) for k, v in zip(keys, values)),)
    yield "two lists", (list(keys), list(values))
    yield "numpy", (np.array(keys), np.array(values))
    yield "pandas series", (pd.Series(values, index=keys),)
    yield "series index", (frame.set_index("k")["v"].index, frame["v"])
    yield "dataframe columns", (frame["k"], frame["v"])
    yield "arrow", (pa.array(keys), pa.array(values))
    yield "arrow chunked", (pa.chunked_array([keys[:3], keys[3:]]), pa.chunked_array([values[:3], values[3:]]))


KEY_COLUMNS = {
    "int": list(range(-3, 7)),
    "uuid": [str(uuid.UUID(int=i * 7919)) for i in range(10)],
    "timestamp": [dt.datetime(2024, 1, 1) + dt.timedelta(hours=i) for i in range(10)],
    "date": [dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(10)],
}


@pytest.mark.parametrize("kind", KEY_COLUMNS)
def test_every_batch_shape_writes_the_same(rs, kind):
    keys, values = KEY_COLUMNS[kind], [i * 1.5 for i in range(10)]
    s = rs.value_state(f"shape-{kind}")
    for name, args in _shapes(keys, values):
        s.delete_many(keys)
        s.put_many(*args)
        want = [s.get(k) for k in keys]
        assert want == values, name
        assert s.get_many(keys) == values, name
        assert s.get_many(np.array(keys)) == values, name
        assert s.get_many(pd.Series(keys)) == values, name
        assert s.get_many(pd.Index(keys)) == values, name
        assert s.get_many(pa.array(keys)) == values, name
        assert s.get_many(iter(keys)) == values, name
    s.delete_many(pa.array(keys))
    assert s.get_many(keys) == [None] * 10


def test_tuple_keys_from_a_dataframe(rs):
    frame = pd.DataFrame({"user": [f"u{i}" for i in range(100)], "day": [dt.date(2024, 1, 1 + i % 28) for i in range(100)], "n": range(100)})
    s = rs.value_state("tuple-keys")
    s.put_many(frame[["user", "day"]], frame["n"])
    assert s.get_many(list(zip(frame["user"], frame["day"]))) == list(range(100))
    assert s.get(("u5", dt.date(2024, 1, 6))) == 5


def test_column_partitions_equal_key_partitions():
    """Whatever form the keys come in, a key lands in one partition: the one partition_of names."""
    for keys in KEY_COLUMNS.values():
        want = [partition_of(k, 64) for k in keys]
        for form in (keys, np.array(keys), pd.Series(keys), pa.array(keys)):
            assert partitions_of(form, 64).tolist() == want
    stamps = pd.Series(pd.date_range("1960-01-01", periods=50, freq="37h17min3s123456789ns"))
    want = [partition_of(t, 64) for t in stamps]
    assert partitions_of(stamps, 64).tolist() == want
    assert partitions_of(pa.array(stamps), 64).tolist() == want
    assert partitions_of(stamps.dt.tz_localize("UTC"), 64).tolist() == [partition_of(t.tz_localize("UTC"), 64) for t in stamps]
    deltas = [dt.timedelta(seconds=i * 1000.5) for i in range(-20, 20)]
    assert partitions_of(np.array(deltas, dtype="timedelta64[us]"), 64).tolist() == [partition_of(d, 64) for d in deltas]
    assert partitions_of(pa.array(deltas), 64).tolist() == [partition_of(d, 64) for d in deltas]
    decimals = [Decimal("1.25"), None, Decimal("-0.50"), Decimal("123456789012345678901.5")]
    assert partitions_of(pa.array(decimals, type=pa.decimal128(38, 2)), 64).tolist() == [
        partition_of(d if d is None else d.quantize(Decimal("0.01")), 64) for d in decimals]


def test_a_bad_item_in_a_batch_is_named_and_nothing_is_written(rs):
    s = rs.value_state("bad-items", create=True)  # read after writes that all fail
    keys = [f"key-{i}" for i in range(100_000)]
    values = list(range(100_000))
    values[73_456] = {1, 2}
    with pytest.raises(InvalidValueError, match=r"value of key 'key-73456' \(index 73456\): cannot encode value of type set") as info:
        s.put_many(keys, values)
    assert info.value.data["index"] == 73_456
    keys[99_999] = ["a list"]
    with pytest.raises(InvalidKeyError, match="key at index 99999: unsupported key type list") as info:
        s.put_many(keys, range(100_000))
    assert info.value.data["index"] == 99_999
    with pytest.raises(InvalidKeyError, match="key at index 2: .*outside the signed 64-bit range"):
        s.get_many([1, 2, 2**64])
    with pytest.raises(InvalidKeyError, match="key at index 1: Decimal key NaN is not finite"):
        s.delete_many([Decimal(1), Decimal("NaN")])
    assert s.count() == 0


def test_bad_batch_shapes_are_refused(embedded):
    s = embedded.value_state("bad-shapes", create=True)
    with pytest.raises(InvalidInputError, match="3 keys but 2 values"):
        s.put_many([1, 2, 3], [1, 2])
    with pytest.raises(InvalidInputError, match="pairs"):
        s.put_many([(1, 2, 3)])
    with pytest.raises(InvalidInputError, match="pairs"):
        s.put_many([1, 2, 3])
    with pytest.raises(InvalidInputError, match="DataFrame"):
        s.put_many(pd.DataFrame({"k": [1], "v": [2]}))
    with pytest.raises(InvalidInputError, match="sequence or array of keys"):
        s.get_many("abc")
    assert s.count() == 0


class Money:
    def __init__(self, cents: int, currency: str) -> None:
        self.cents, self.currency = cents, currency

    def __eq__(self, other):
        return isinstance(other, Money) and (self.cents, self.currency) == (other.cents, other.currency)


def test_a_registered_codec_round_trips_a_user_type(embedded):
    s = embedded.value_state("codec")
    with pytest.raises(InvalidValueError, match="cannot encode value of type Money.*register_codec"):
        s.put("m", Money(5, "EUR"))
    rockstate.register_codec(Money, 64, lambda m: msgpack.packb([m.cents, m.currency]), lambda b: Money(*msgpack.unpackb(b)))
    s.put("m", Money(5, "EUR"))
    s.put("ms", [Money(1, "USD"), (Money(2, "JPY"),)])
    assert s.get("m") == Money(5, "EUR") and s.get("ms") == [Money(1, "USD"), (Money(2, "JPY"),)]
    with pytest.raises(ConfigError, match="64..127"):
        rockstate.register_codec(Money, 7, bytes, bytes)
    with pytest.raises(ConfigError, match="taken by Money"):
        rockstate.register_codec(dict, 64, bytes, bytes)
    with pytest.raises(InvalidKeyError, match="Money"):
        s.put(Money(1, "EUR"), 1)


def test_data_written_before_the_ext_types_still_decodes():
    """Bytes as the previous encoder wrote them: plain msgpack, tuples as arrays."""
    old_value = msgpack.packb({"a": [1, 2], "t": (3, 4), "s": "x", "b": b"y", "f": 1.5}, use_bin_type=True)
    assert decode_value(old_value) == {"a": [1, 2], "t": [3, 4], "s": "x", "b": b"y", "f": 1.5}
    for key in [7, "user-1", b"\x00", 2.5, True, None, ("a", 1, None)]:
        assert encode_key(key) == msgpack.packb(key, use_bin_type=True)  # keys are stored as before
        assert decode_key(encode_key(key)) == key


def test_size_limit_names_the_item(tmp_path):
    with rockstate.open(str(tmp_path / "db"), partitions=2, max_key_bytes=40, max_value_bytes=100) as rs:
        s = rs.value_state("v")
        with pytest.raises(SizeLimitError, match=r"value of key 'b' \(index 1\): value of 200 bytes"):
            s.put_many(["a", "b"], [b"x", b"x" * 198])
        with pytest.raises(SizeLimitError, match="key at index 1: key of"):
            s.put_many(["a", "b" * 100], [1, 2])



class _Date(dt.date):
    pass


class _DateTime(dt.datetime):
    pass


class _Decimal(Decimal):
    pass


class _UUID(uuid.UUID):
    pass


_Row = collections.namedtuple("_Row", "a b c d")
_ROW = (1, "a", Decimal("2.5"), dt.date(2026, 1, 1))
_PARIS, _MINUS_3_30 = zoneinfo.ZoneInfo("Europe/Paris"), dt.timezone(dt.timedelta(hours=-3, minutes=-30))


@pytest.mark.parametrize("value, subclassed", [
    (dt.date(2026, 11, 28), _Date(2026, 11, 28)),
    (dt.date(1, 1, 1), _Date(1, 1, 1)),
    (dt.datetime(2026, 11, 28, 1, 2, 3, 456789), _DateTime(2026, 11, 28, 1, 2, 3, 456789)),
    (dt.datetime(2026, 11, 28, 1, 2, 3, tzinfo=_PARIS), _DateTime(2026, 11, 28, 1, 2, 3, tzinfo=_PARIS)),
    (dt.datetime(2026, 11, 28, tzinfo=_MINUS_3_30), _DateTime(2026, 11, 28, tzinfo=_MINUS_3_30)),
    (Decimal("-12345.678900"), _Decimal("-12345.678900")),
    (Decimal("NaN"), _Decimal("NaN")),
    (uuid.UUID(int=7), _UUID(int=7)),
    (_ROW, _Row(*_ROW)),
])
def test_the_common_types_encode_as_their_subclasses_do(value, subclassed):
    """Values of the common types are encoded by their exact type, before the general look (``codecs._EXACT``):
    the bytes are the general path's, which their subclasses take, so what was written before reads the same."""
    encoded = encode_value(value)
    assert encoded == encode_value(subclassed)
    assert encode_value(decode_value(encoded)) == encoded  # NaN is not equal to itself: compared as encoded
    assert type(decode_value(encoded)) is type(value)
