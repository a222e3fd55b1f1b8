"""A processor's handles without Spark: typed state, Spark's TTL, timers, schema changes.

The handles run over an embedded store (real RocksDB) in the batch machinery
the operator uses; a batch's clock is set by hand (what the operator takes
from the query's batch clock).
"""

import datetime as dt
from decimal import Decimal

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import Row
from pyspark.sql import types as T

import rockstate
from rockstate.errors import InvalidValueError, StateSchemaError, TimerModeError
from rockstate.keys import partition_of
from rockstate.serde import decode_stream, encode_key
from rockstate.spark import expiry
from rockstate.spark.batch import Batch, BatchWriter
from rockstate.spark.processor import StatefulProcessorHandle

EVERY_TYPE = T.StructType([
    T.StructField("b", T.ByteType()), T.StructField("s", T.ShortType()), T.StructField("i", T.IntegerType()),
    T.StructField("l", T.LongType()), T.StructField("f", T.FloatType()), T.StructField("d", T.DoubleType()),
    T.StructField("str", T.StringType()), T.StructField("bin", T.BinaryType()), T.StructField("ok", T.BooleanType()),
    T.StructField("ts", T.TimestampType()), T.StructField("day", T.DateType()), T.StructField("amount", T.DecimalType(12, 2)),
    T.StructField("tags", T.ArrayType(T.IntegerType())), T.StructField("attrs", T.MapType(T.StringType(), T.LongType())),
    T.StructField("where", T.StructType([T.StructField("city", T.StringType()), T.StructField("zip", T.IntegerType())])),
])


class Clock:
    processing_ms = 1_000_000


@pytest.fixture
def rs(tmp_path):
    with rockstate.open(str(tmp_path / "db"), partitions=4) as handle:
        yield handle


def handle_of(rs, time_mode="processingtime"):
    return StatefulProcessorHandle(rs.backend, "op", clock=Clock(), time_mode=time_mode)


def on_key(handle, key, work):
    """``work()`` as a per-key handler of ``key`` in one batch, written back at its end."""
    batch = Batch(handle.backend, BatchWriter(handle.backend))
    handle.begin(batch)
    encoded, pids = handle.encode_keys([key])
    batch.current = (encoded[0], int(pids[0]))
    try:
        return work()
    finally:
        batch.current = None
        handle.finish()


def test_typed_value_state_takes_numpy_and_pandas_and_returns_rows(rs):
    handle = handle_of(rs)
    state = handle.get_value_state("every", EVERY_TYPE)
    when = pd.Timestamp("2024-03-01 12:30:00.123456")
    value = (np.int8(1), np.int16(-2), np.int32(3), np.int64(1 << 40), np.float32(1.5), 2.25, "uuid-ish", b"\x00\x01", np.bool_(True),
             when, dt.date(2024, 2, 29), Decimal("1234.50"), np.array([1, 2, 3]), {"a": np.int64(7)}, ("Berlin", 10115))
    on_key(handle, "k1", lambda: state.update(value))
    got = on_key(handle, "k1", state.get)
    assert isinstance(got, Row) and got.where == Row(city="Berlin", zip=10115)
    assert got == (1, -2, 3, 1 << 40, 1.5, 2.25, "uuid-ish", b"\x00\x01", True, when.to_pydatetime(), dt.date(2024, 2, 29),
                   Decimal("1234.50"), [1, 2, 3], {"a": 7}, ("Berlin", 10115))
    assert got[0] == 1 and got.amount == Decimal("1234.50")
    with pytest.raises(InvalidValueError, match="does not fit"):
        on_key(handle, "k1", lambda: state.update(("not a byte",) + value[1:]))


def test_typed_map_and_list_state_as_spark_gives_them(rs):
    handle = handle_of(rs)
    counts = handle.get_map_state("counts", T.StructType([T.StructField("name", T.StringType())]),
                                  T.StructType([T.StructField("count", T.IntegerType())]))
    seen = handle.get_list_state("seen", T.StructType([T.StructField("at", T.TimestampType())]))
    at = dt.datetime(2024, 1, 1, 8, 0)

    def work():
        counts.update_value(("key2",), (2,))
        counts.update_value(("key1",), (np.int64(1),))
        seen.append_list([(at,), (pd.Timestamp(at) + pd.Timedelta(minutes=1),)])
        return list(counts.iterator()), list(seen.get())

    items, listed = on_key(handle, ("t", 1), work)
    assert items == [(("key1",), (1,)), (("key2",), (2,))]  # a stored tuple comes back as a tuple (a Row)
    assert next(iter(items))[0] == ("key1",) and listed == [(at,), (at + dt.timedelta(minutes=1),)]


def test_a_schema_may_gain_nullable_fields_and_nothing_else(rs):
    old = T.StructType([T.StructField("n", T.LongType())])
    handle = handle_of(rs)
    state = handle.get_value_state("evolving", old)
    handle.record_schemas()
    on_key(handle, "k", lambda: state.update((5,)))

    grown = T.StructType([*old.fields, T.StructField("note", T.StringType(), True)])
    later = handle_of(rs)
    state = later.get_value_state("evolving", grown)
    later.record_schemas()
    assert on_key(later, "k", state.get) == Row(n=5, note=None)

    for bad in (T.StructType([T.StructField("n", T.StringType())]), T.StructType([T.StructField("m", T.LongType())]),
                T.StructType([*old.fields, T.StructField("must", T.StringType(), False)])):
        wrong = handle_of(rs)
        wrong.get_value_state("evolving", bad)
        with pytest.raises(StateSchemaError, match="evolving"):
            wrong.record_schemas()
    untyped = handle_of(rs)
    untyped.value_state("evolving", ttl=60)
    with pytest.raises(StateSchemaError, match="without a TTL"):
        untyped.record_schemas()


def test_ttl_counts_from_the_batch_timestamp_in_spark_units(rs):
    handle = handle_of(rs)
    value = handle.get_value_state("v", T.StructType([T.StructField("n", T.LongType())]), ttl_duration_ms=10_000)
    items = handle.get_list_state("l", None, ttl_duration_ms=10_000)
    on_key(handle, "k", lambda: (value.update((1,)), items.append_value("first")))
    handle.clock.processing_ms += 5_000
    on_key(handle, "k", lambda: items.append_value("second"))
    handle.clock.processing_ms += 4_999  # 9.999 s after the first write: both alive
    assert on_key(handle, "k", lambda: (value.get(), list(items.get()))) == ((1,), ["first", "second"])
    handle.clock.processing_ms += 1  # the batch's time reaches the first expiry
    assert on_key(handle, "k", lambda: (value.exists(), list(items.get()))) == (False, ["second"])
    handle.clock.processing_ms += 5_000
    assert on_key(handle, "k", items.exists) is False


def test_timers_per_key_in_time_order_and_expired_ones_found_by_time(rs):
    handle = handle_of(rs)
    for key, times in (("a", [30, 10]), ("b", [20]), (("tuple", 2), [-5, 40])):
        on_key(handle, key, lambda times=times: [handle.register_timer(t) for t in times])
    assert on_key(handle, "a", lambda: list(handle.list_timers())) == [10, 30]
    on_key(handle, "a", lambda: handle.delete_timer(30))

    batch = Batch(rs.backend, BatchWriter(rs.backend))
    handle.begin(batch)
    view = batch.view(handle.timer_state, "timers")
    handle.register_timers(pd.Series(["c", "d"]), [15, 99])  # the batch's own, vectorized
    expired = view.expired(range(4), 25)
    handle.finish()
    assert [(ms, k) for ms, k, _ in expired] == [(-5, encode_key(("tuple", 2))), (10, encode_key("a")), (15, encode_key("c")),
                                                  (20, encode_key("b"))]
    handle.begin(Batch(rs.backend, BatchWriter(rs.backend)))
    fired = handle.batch("timers").view(handle.timer_state, "timers")
    expired = fired.expired(range(4), 25)
    handle.register_timers(["e"], [7])  # registered after the fire, at a time it reached: fires in the next batch
    fired.fire(expired, 25)
    handle.finish()  # a new batch fired them as the task does, deleting each
    listed = {key: on_key(handle, key, lambda: list(handle.list_timers())) for key in ("a", "b", "c", "d", "e", ("tuple", 2))}
    assert listed == {"a": [], "b": [], "c": [], "d": [99], "e": [7], ("tuple", 2): [40]}
    handle.begin(Batch(rs.backend, BatchWriter(rs.backend)))
    assert list(handle.batch("timers").view(handle.timer_state, "timers").expired(range(4), 99)) == [
        (7, encode_key("e"), partition_of("e", 4)), (40, encode_key(("tuple", 2)), partition_of(("tuple", 2), 4)), (99, encode_key("d"), partition_of("d", 4))]
    handle.finish()
    untimed = handle_of(rs, "none")
    with pytest.raises(TimerModeError, match="time_mode"):
        on_key(untimed, "a", lambda: untimed.register_timer(5))


def fire_batch(handle, bound, before_fire=lambda: None, after_fire=lambda: None, batch=None):
    """One round that fires the timers up to ``bound`` on every partition, as a task's last round does."""
    batch = batch or Batch(handle.backend, BatchWriter(handle.backend))
    handle.begin(batch)
    view = batch.view(handle.timer_state, "timers")
    before_fire()
    expired = view.expired(range(4), bound)
    view.fire(expired, bound)
    after_fire()
    handle.finish()
    return [(ms, k) for ms, k, _ in expired]


def test_a_fire_keeps_each_keys_later_timers_whichever_way_the_batch_touched_the_key(rs):
    handle = handle_of(rs)
    for key, times in (("two", [10, 50]), ("one", [20]), ("later", [30]), ("moved", [15, 60])):
        on_key(handle, key, lambda times=times: [handle.register_timer(t) for t in times])
    listed = lambda key: on_key(handle, key, lambda: list(handle.list_timers()))
    key_of = lambda k: encode_key(k)

    def change_after_fire():  # a handler's changes after the fire: a fired time again, and a new one
        handle.register_timers(["later"], [25])
        handle.delete_timers(["moved"], [60])

    def change_before_fire():  # a handler's registration of a timer the fire then finds: it fires once
        handle.register_timers(["one"], [20])

    fired = fire_batch(handle, 25, before_fire=change_before_fire, after_fire=change_after_fire)
    assert fired == [(10, key_of("two")), (15, key_of("moved")), (20, key_of("one"))]
    assert {k: listed(k) for k in ("two", "one", "later", "moved")} == {"two": [50], "one": [], "later": [25, 30], "moved": []}
    # the kept timers' index entries carry the key's new times: a later fire finds and removes them alone
    assert fire_batch(handle, 40) == [(25, key_of("later")), (30, key_of("later"))]
    assert listed("later") == [] and listed("two") == [50]
    assert fire_batch(handle, 100) == [(50, key_of("two"))]
    assert listed("two") == [] and fire_batch(handle, 1000) == []
    assert not [k for pid in range(4) for k in rs.backend.scan(handle.timer_state, pid, b"", None, 10)], "no entry is left"


def test_a_fire_in_a_later_round_of_one_task_sees_the_rounds_before_it(rs):
    """A task's rounds are staged, so the fire reads the committed index: a key changed by an earlier round of the
    task must not be rewritten from its committed entry."""
    handle = handle_of(rs)
    on_key(handle, "k", lambda: [handle.register_timer(t) for t in (10, 70)])
    batch = Batch(handle.backend, BatchWriter(handle.backend), keep=True)  # the task's rounds, written at the end
    handle.begin(batch)
    encoded, pids = handle.encode_keys(["k"])
    batch.current = (encoded[0], int(pids[0]))
    handle.delete_timer(70)
    handle.register_timer(90)
    batch.current = None
    handle.finish()
    assert fire_batch(handle, 50, batch=batch) == [(10, encode_key("k"))]
    batch.writer.flush()
    assert on_key(handle, "k", lambda: list(handle.list_timers())) == [90]
    assert fire_batch(handle, 100) == [(90, encode_key("k"))]


def test_timers_stored_without_their_keys_times_in_the_index_still_fire_once(rs):
    """Index entries with empty values (as written before they carried the key's times) fire through the overlay."""
    handle = handle_of(rs)
    on_key(handle, "k", lambda: [handle.register_timer(t) for t in (10, 70)])
    pid = partition_of("k", 4)
    entries = [k for k, _ in rs.backend.scan(handle.timer_state, pid, b"t", None, 10)]
    rs.backend.write({pid: [(4, handle.timer_state, entries, [b""] * len(entries))]})  # PUT_MANY, the old values
    assert fire_batch(handle, 50) == [(10, encode_key("k"))]
    assert on_key(handle, "k", lambda: list(handle.list_timers())) == [70]
    assert fire_batch(handle, 100) == [(70, encode_key("k"))] and fire_batch(handle, 200) == []


def test_ttl_cleanup_deletes_what_expired_at_the_end_of_the_batch_as_spark(rs):
    handle = handle_of(rs)
    value = handle.get_value_state("v", T.StructType([T.StructField("n", T.LongType())]), ttl_duration_ms=10_000)
    items = handle.get_list_state("l", None, ttl_duration_ms=10_000)
    entries = handle.get_map_state("m", None, None, ttl_duration_ms=10_000)
    plain = handle.get_value_state("kept")  # no TTL: never cleaned
    for key in ("a", "b", ("tuple", 7)):
        on_key(handle, key, lambda: (value.update((1,)), items.append_value("old"), entries.update_value("x", 1), plain.update(0)))
    handle.clock.processing_ms += 6_000
    on_key(handle, "b", lambda: (value.update((2,)), items.append_value("new"), entries.update_value("y", 2)))

    def clean_at(ms: int) -> int:
        handle.clock.processing_ms = ms
        batch = Batch(rs.backend, BatchWriter(rs.backend))
        handle.begin(batch)
        deleted = expiry.clean(handle, batch, range(4), ms)
        handle.finish()
        return deleted

    def stored(state: str) -> dict:
        full = handle._full(state)
        return {k: v for pid in range(4) for k, v in rs.backend.scan(full, pid, b"", None, 1000)}

    start = Clock.processing_ms
    assert clean_at(start + 9_999) == 0 and len(stored("v")) == 3  # nothing expired yet
    # 10 s after the first writes: a's and the tuple key's value, list and map entry go; b's value (rewritten at +6 s)
    # stays, its list keeps the element written at +6 s and its map the entry "y"
    assert clean_at(start + 10_000) == 3 + 3 + 3 - 1
    assert set(stored("v")) == {encode_key("b")}
    assert [decode_stream(v) for v in stored("l").values()] == [[[start + 16_000, "new"]]]
    assert len(stored("m")) == 1 and len(stored("kept")) == 3
    assert clean_at(start + 16_000) == 3 and not stored("v") and not stored("l") and not stored("m")
    assert not [k for pid in range(4) for k in rs.backend.scan(handle.ttl_index, pid, b"", None, 10)]  # the index emptied too
    assert clean_at(start + 20_000) == 0  # exactly once: nothing is found again
