"""Embedded mode: the client API over a real on-disk store."""

import datetime as dt
import threading
import time
import uuid

import pytest

import rockstate
from rockstate.errors import (
    InvalidKeyError,
    InvalidNameError,
    InvalidValueError,
    PartitionCountError,
    RockstateError,
    SizeLimitError,
    StateKindError,
    StoreClosedError,
    StoreLockedError,
    UnknownStateError,
)
from rockstate.keys import partition_of


@pytest.fixture
def rs(tmp_path):
    with rockstate.open(str(tmp_path / "db"), partitions=8) as handle:
        yield handle


def wait_for(condition, timeout=10.0, interval=0.02):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(interval)


VALUES = [None, True, False, 0, -1, 2**63 - 1, -(2**63), 1.5, float("inf"), "", "héllo 🚀", b"", b"\x00\xff", [1, "a", [None]], {"a": 1, "b": {"c": [1.0]}}, {1: "int key"}]


def test_value_state_roundtrip_of_every_type(rs):
    s = rs.value_state("v")
    for i, value in enumerate(VALUES):
        s.put(("k", i), value)
    assert [s.get(("k", i)) for i in range(len(VALUES))] == VALUES
    assert s.get_many([("k", i) for i in range(len(VALUES))]) == VALUES


def test_value_state_operations(rs):
    s = rs.value_state("counts", create=True)  # read before any write
    assert s.get("missing") is None
    assert s.get("missing", 7) == 7
    assert "a" not in s
    s.put("a", 1)
    assert "a" in s and s.contains("a")
    s.put_many({"b": 2, "c": 3})
    s.put_many([("d", 4), (5, "five")])
    assert s.get_many(["a", "b", "x", 5], default=-1) == [1, 2, -1, "five"]
    assert s.count() == 5
    assert sorted(map(str, s.keys())) == ["5", "a", "b", "c", "d"]
    assert dict(s.items()) == {"a": 1, "b": 2, "c": 3, "d": 4, 5: "five"}
    s.delete("a")
    s.delete_many(["b", "c", "nope"])
    assert dict(s.items()) == {"d": 4, 5: "five"}


def test_a_state_is_defined_by_create_or_a_first_write_never_by_a_read(rs):
    rs.value_state("q-1.count.clicks", create=True).put("ann", 3)  # as a query's operator names its state
    clicks = rs.value_state("clicks")
    with pytest.raises(UnknownStateError, match=r"no state 'clicks'; did you mean 'q-1.count.clicks'\? \(pass create=True") as info:
        clicks.get("ann")
    assert info.value.data["matches"] == ["q-1.count.clicks"]
    for read in (lambda: clicks.get_many(["ann"]), clicks.count, lambda: list(clicks.items()), lambda: "ann" in clicks):
        with pytest.raises(UnknownStateError):
            read()
    with pytest.raises(UnknownStateError):
        list(rs.map_state("sessions").items("ann"))
    assert set(rs.stats()["states"]) == {"q-1.count.clicks"}  # no read defined anything
    assert rs.list_state("empty", create=True).get("ann") == []  # create=True: defined at once, reads answer empty
    rs.map_state("sessions").put("ann", "s1", 1)  # a first write defines it
    assert set(rs.stats()["states"]) == {"q-1.count.clicks", "empty", "sessions"}
    other = rs.value_state("later")  # made before the state exists; another handle defines it
    rs.value_state("later").put("k", 1)
    assert other.get("k") == 1  # looked up again at its read
    with pytest.raises(StateKindError):
        rs.map_state("q-1.count.clicks")  # an existing state keeps its kind


def test_keys_of_every_type_are_distinct(rs):
    s = rs.value_state("k")
    keys = [None, True, 1, 1.0, "1", b"1", (1,), (1, "1"), (None, 2.5, b"x", False), -(2**63), 2**63 - 1]
    for i, key in enumerate(keys):
        s.put(key, i)
    assert [s.get(k) for k in keys] == list(range(len(keys)))
    assert s.count() == len(keys)
    assert set(s.keys()) == set(keys)


def test_many_int_keys_take_the_vectorized_path(rs):
    s = rs.value_state("big")
    s.put_many((i, i * 2) for i in range(20_000))
    assert s.get_many(range(0, 20_000, 7)) == [i * 2 for i in range(0, 20_000, 7)]
    assert s.count() == 20_000
    # each key went to the partition the public partitioner names
    part = rs.backend.store.partition(rs.partition_of(12345))
    assert part.get_many("big", [rockstate.serde.encode_key(12345)]) != [None]


def test_map_state(rs):
    m = rs.map_state("m")
    m.put("user1", "a", 1)
    m.put("user1", "b", {"x": 2})
    m.put_all("user1", {("t", 1): [3]})
    m.put("user2", "a", 9)
    assert m.get("user1", "a") == 1
    assert m.get("user1", "zz", "dflt") == "dflt"
    assert m.contains("user1", "b") and not m.contains("user2", "b")
    assert dict(m.items("user1")) == {"a": 1, "b": {"x": 2}, ("t", 1): [3]}
    assert sorted(map(str, m.keys("user1"))) == sorted(map(str, ["a", "b", ("t", 1)]))
    m.delete("user1", "a")
    assert dict(m.items("user1")) == {"b": {"x": 2}, ("t", 1): [3]}
    m.clear("user1")
    assert dict(m.items("user1")) == {}
    assert dict(m.items("user2")) == {"a": 9}
    assert sorted(m.entries()) == [("user2", "a", 9)]


def test_map_keys_that_prefix_each_other_stay_apart(rs):
    m = rs.map_state("m")
    # "a" and "ab" encode with different length headers, so neither is a prefix of the other
    m.put("a", "x", 1)
    m.put("ab", "x", 2)
    m.put(("a",), "x", 3)
    assert dict(m.items("a")) == {"x": 1}
    m.clear("a")
    assert m.get("ab", "x") == 2 and m.get(("a",), "x") == 3


def test_list_state(rs):
    lst = rs.list_state("l", create=True)
    assert lst.get("k") == []
    lst.append("k", 1)
    lst.append("k", "two")
    lst.extend("k", [[3], {"four": 4}])
    lst.extend("k", [])
    assert lst.get("k") == [1, "two", [3], {"four": 4}]
    lst.put("k", ["reset"])
    assert lst.get("k") == ["reset"]
    lst.clear("k")
    assert lst.get("k") == []
    assert lst.count() == 0


def test_reopen_restores_everything(tmp_path):
    path = str(tmp_path / "db")
    with rockstate.open(path, partitions=4) as rs:
        rs.value_state("v").put_many({i: str(i) for i in range(1000)})
        rs.map_state("m").put("k", "u", 1)
        rs.list_state("l").extend("k", [1, 2])
    with rockstate.open(path, partitions=4) as rs:
        assert rs.value_state("v").get_many(range(1000)) == [str(i) for i in range(1000)]
        assert rs.map_state("m").get("k", "u") == 1
        assert rs.list_state("l").get("k") == [1, 2]
        assert set(rs.stats()["states"]) == {"v", "m", "l"}


def test_reopen_with_another_partition_count_is_refused(tmp_path):
    path = str(tmp_path / "db")
    rockstate.open(path, partitions=4).close()
    with pytest.raises(PartitionCountError, match="created with 4 partitions"):
        rockstate.open(path, partitions=8)
    rockstate.open(path, partitions=4).close()  # the refusal left it intact


def test_second_open_of_the_same_path_is_refused(tmp_path):
    path = str(tmp_path / "db")
    with rockstate.open(path, partitions=2):
        with pytest.raises(StoreLockedError, match="already open"):
            rockstate.open(path, partitions=2)


def test_one_name_as_two_kinds_is_refused(rs):
    rs.value_state("s").put(1, 1)
    with pytest.raises(StateKindError, match="is a value state"):
        rs.map_state("s")
    with pytest.raises(StateKindError, match="ttl"):
        rs.value_state("s", ttl=10)
    assert rs.value_state("s").get(1) == 1


@pytest.mark.parametrize("name", ["", "a/b", "..", "a..b", "../x", "x\\y", "_internal", "a" * 200, 5, None])
def test_bad_state_names(rs, name):
    with pytest.raises(InvalidNameError, match="invalid state name"):
        rs.value_state(name)


@pytest.mark.parametrize("key", [[1], {"a": 1}, {1}, 2**64, object(), (1, [2]), ((1,),), 1j])
def test_unsupported_key_type_names_the_type(rs, key):
    with pytest.raises(InvalidKeyError) as info:
        rs.value_state("v").put(key, 1)
    assert "key" in str(info.value)
    assert isinstance(info.value, RockstateError)


@pytest.mark.parametrize("value", [{1, 2}, object(), 2**70, 1j])
def test_unsupported_value_type_names_the_type(rs, value):
    with pytest.raises(InvalidValueError, match=type(value).__name__):
        rs.value_state("v").put("k", value)


def test_size_limits_name_the_limit(tmp_path):
    with rockstate.open(str(tmp_path / "db"), partitions=2, max_key_bytes=100, max_value_bytes=1000) as rs:
        s = rs.value_state("v")
        with pytest.raises(SizeLimitError, match="limit of 100 bytes"):
            s.put("k" * 200, 1)
        with pytest.raises(SizeLimitError, match="limit of 1000 bytes"):
            s.put("k", b"x" * 2000)
        s.put("k", b"x" * 900)
        assert s.get("k") == b"x" * 900


def test_default_limit_is_16_mib(rs):
    s = rs.value_state("v")
    with pytest.raises(SizeLimitError, match=str(16 * 1024 * 1024)):
        s.put("k", b"x" * (16 * 1024 * 1024 + 1))


def test_a_batch_with_one_bad_item_writes_nothing(rs):
    s = rs.value_state("v", create=True)  # counted below, after writes that all fail
    with pytest.raises(InvalidValueError):
        s.put_many([(1, "ok"), (2, "ok"), (3, {1, 2})])
    with pytest.raises(InvalidKeyError):
        s.put_many([(1, "ok"), ([2], "bad")])
    with pytest.raises(InvalidKeyError):
        s.delete_many([1, [2]])
    assert s.count() == 0


def test_ttl_hides_expired_entries_and_sweeps_them(tmp_path):
    with rockstate.open(str(tmp_path / "db"), partitions=2, ttl_sweep_interval=0.05) as rs:
        s = rs.value_state("session", ttl=0.3)
        m = rs.map_state("msession", ttl=0.3)
        keep = rs.value_state("keep")
        s.put_many({i: i for i in range(50)})
        m.put("k", "u", 1)
        keep.put("k", 1)
        assert s.get(1) == 1 and m.get("k", "u") == 1
        wait_for(lambda: s.get(1) is None and m.get("k", "u") is None)
        assert s.count() == 0 and list(m.items("k")) == []
        store = rs.backend.store

        def stored():
            return sum(len(list(store.partition(p).family("session").keys())) for p in store.owned())

        wait_for(lambda: stored() == 0)  # removed from RocksDB, not only hidden
        assert keep.get("k") == 1


def test_ttl_refreshes_on_write(tmp_path):
    with rockstate.open(str(tmp_path / "db"), partitions=2) as rs:
        s = rs.value_state("s", ttl=0.5)
        s.put("k", 1)
        written = time.monotonic()
        wait_for(lambda: time.monotonic() - written > 0.3)
        s.put("k", 2)
        wait_for(lambda: time.monotonic() - written > 0.6)
        assert s.get("k") == 2  # the first write would have expired by now


def test_stats_per_state_and_partition(rs):
    rs.value_state("a").put_many({i: "x" for i in range(100)})
    rs.map_state("b").put_all("k", {i: i for i in range(10)})
    stats = rs.stats()
    assert stats["states"]["a"]["keys"] == 100 and stats["states"]["a"]["kind"] == "value"
    assert stats["states"]["b"]["keys"] == 10
    assert stats["states"]["a"]["bytes"] > 100
    assert sum(p["keys"] for p in stats["partitions"].values()) == 110
    assert len(stats["partitions"]) == 8


def test_closed_handle_raises_a_typed_error(tmp_path):
    rs = rockstate.open(str(tmp_path / "db"), partitions=2)
    rs.close()
    rs.close()  # idempotent
    with pytest.raises(StoreClosedError):
        rs.value_state("v")


def test_concurrent_writers_lose_nothing(rs):
    lst = rs.list_state("l")
    s = rs.value_state("v")

    def work(t):
        for i in range(200):
            lst.append("shared", (t, i))
            s.put((t, i), i)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(lst.get("shared")) == 800
    assert s.count() == 800


def test_partition_of_is_exposed(rs):
    assert rs.partition_of(42) == rockstate.partition_of(42, 8)
    assert 0 <= rs.partition_of(("a", 1)) < 8


@pytest.mark.parametrize("partitions", [1, 8])
def test_batches_keep_the_callers_order_whatever_partitions_they_span(tmp_path, partitions):
    """get_many answers in the keys' order, absent keys as the default, whether a batch spans partitions or
    falls in one (then it goes as it is, unsorted); delete_many likewise."""
    keys = [str(uuid.UUID(int=i * 7919)) for i in range(40)] + [("tenant-7", i) for i in range(10)] \
        + [dt.datetime(2026, 11, 23, 12, i) for i in range(10)]
    with rockstate.open(str(tmp_path / "db"), partitions=partitions) as rs:
        s = rs.value_state("s")
        s.put_many(keys[::2], [{"i": i, "at": dt.date(2026, 1, 1 + i % 28)} for i in range(0, len(keys), 2)])
        want = [{"i": i, "at": dt.date(2026, 1, 1 + i % 28)} if i % 2 == 0 else "absent" for i in range(len(keys))]
        assert s.get_many(keys, default="absent") == want
        first = [k for k in keys if partition_of(k, partitions) == partition_of(keys[0], partitions)]
        assert len(first) >= 5
        assert s.get_many(first[::-1], default="absent") == [want[keys.index(k)] for k in first[::-1]]
        s.delete_many(first)
        assert s.get_many(keys, default="absent") == ["absent" if k in first else w for k, w in zip(keys, want)]
