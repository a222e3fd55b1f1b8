"""A partition's scan: prefix, ``after``, ``stop`` and ``limit`` agree with the entries' key order, with and
without TTL (the two take different paths: RocksDB bounds one, Python filters the other)."""

import random

import pytest

from rockstate.config import StoreConfig
from rockstate.store import PUT_MANY, StateSpec, Store


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
