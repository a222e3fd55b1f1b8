"""A partition's scan: prefix, ``after``, ``stop`` and ``limit`` agree with the entries' key order, with and
without TTL (the two take different paths: RocksDB bounds one, Python filters the other)."""

import random

import pytest

from rockstate.config import StoreConfig
from rockstate.errors import PartitionUnavailableError
from rockstate.store import PUT_MANY, StateSpec, Store
from rockstate.store.partition import RAW_PUT, now_ms


@pytest.fixture
def part(tmp_path):
    store = Store(str(tmp_path / "s"), StoreConfig(partitions=1))
    store.define_state(StateSpec("plain", "value"))
    store.define_state(StateSpec("ttl", "value", ttl=3600))
    yield store.partition(0)
    store.close()


def test_scan_bounds_agree_with_key_order_on_both_paths(part):
    rng = random.Random(7)
    # keys that share prefixes and end in 0xff bytes: where a prefix's end is computed, not a simple increment
    alphabet = [b"a", b"b", b"\x00", b"\xff", b"ts"]
    keys = sorted({b"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(400)})
    values = [b"v%d" % i for i in range(len(keys))]
    for state in ("plain", "ttl"):
        part.write([(PUT_MANY, state, keys, values)])
    stored = dict(zip(keys, values))
    probes = [b""] + alphabet + [rng.choice(keys) for _ in range(20)]
    for _ in range(600):
        prefix = rng.choice([b"", b"a", b"\xff", b"ts", b"a\xff", rng.choice(keys)[:2]])
        after = rng.choice([None, rng.choice(probes)])
        stop = rng.choice([None, rng.choice(probes)])
        limit = rng.choice([None, 1, 2, 5, 1000])
        want = [(k, stored[k]) for k in keys if k.startswith(prefix) and (after is None or k > after)
                and (stop is None or k < stop)][:limit]
        for state in ("plain", "ttl"):
            got = part.scan(state, prefix, after, limit, stop)
            assert [tuple(e) for e in got] == want, (state, prefix, after, stop, limit)


def test_a_read_of_many_partitions_in_one_multi_get_answers_each_its_own_keys(tmp_path):
    """``Store.get_runs``: the same answers as each partition's ``get_many`` (keys shared between partitions, a
    TTL state's header removed and its expired entries absent, a partition in two runs, one key); a partition closed
    is refused."""
    store = Store(str(tmp_path / "s"), StoreConfig(partitions=64))
    store.define_state(StateSpec("plain", "value"))
    store.define_state(StateSpec("ttl", "value", ttl=3600))
    try:
        for pid in range(64):
            store.open_partition(pid)
        rng = random.Random(3)
        written = {pid: [b"user-%d" % rng.randrange(40) for _ in range(rng.randint(0, 6))] for pid in range(64)}
        for state in ("plain", "ttl"):
            store.write_all([(pid, [(PUT_MANY, state, keys, [b"%d:%s" % (pid, k) for k in keys])])
                             for pid, keys in written.items() if keys])
        stale = store.partition(5)  # an entry expired a second ago, stored as a TTL state's is
        stale.write([(RAW_PUT, "ttl", b"user-old", (now_ms() - 1000).to_bytes(8, "big") + b"gone")])
        groups = [(pid, [b"user-%d" % rng.randrange(40) for _ in range(rng.randint(1, 8))]) for pid in range(64)]
        groups[5][1].append(b"user-old")
        groups.append((3, [b"user-1", b"user-2"]))
        pids, counts = [pid for pid, _ in groups], [len(keys) for _, keys in groups]
        keys = [k for _, ks in groups for k in ks]
        for state in ("plain", "ttl"):
            found = store.get_runs(state, pids, counts, keys)
            assert found == [v for pid, ks in groups for v in store.get_many(pid, state, ks)]
            assert found == [b"%d:%s" % (pid, k) if k in written[pid] else None for pid, ks in groups for k in ks]
            assert store.get_runs(state, [5], [1], [b"user-old"]) == [None]
            assert store.get_runs(state, [], [], []) == []
        store.close_partition(9)
        with pytest.raises(PartitionUnavailableError):
            store.get_runs("plain", pids, counts, keys)
    finally:
        store.close()
