"""A request's plain puts to many partitions staged at once (store/puts.py): the same entries, shipped batches,
recorded writes and request ids as piece by piece, and any other shape still piece by piece."""

import pytest

from rockstate.config import StoreConfig
from rockstate.errors import ProtocolError, SizeLimitError, UnknownStateError
from rockstate.ops import PUT, PUT_MANY, RAW_PUT, RAW_PUT_MANY
from rockstate.store import StateSpec, Store, requests
from rockstate.store.checks import check_ops, check_put_pieces
from rockstate.store.partition import REPLICATION, SEQ_KEY
from rockstate.cluster.replication.runs import stored_piece
from rockstate.store.writes import put_pieces_bytes, stored_bytes

P = 64


def _store(path):
    store = Store(str(path), StoreConfig(partitions=P), reserved=("_requests", "_replication"))
    store.define_state(StateSpec("v", "value"))
    store.define_state(StateSpec("w", "value"))
    store.define_state(StateSpec("t", "value", ttl=3600))
    return store


def _groups(n, state="v", tag=b""):
    """A batch put's pieces: string, tuple-like and binary keys, three per partition over ``n`` partitions."""
    return [(pid, [(PUT_MANY, state, [f"user-{pid}-{i}".encode() + tag for i in range(3)],
                    [f"{pid}:{i}:2026-11-27T10:00:00.000001+00:00:12.50".encode() for i in range(3)])])
            for pid in range(0, 2 * n, 2)]


def _everything(store, state):
    return {pid: list(store.partition(pid).raw_items(state)) for pid in range(P)}


@pytest.fixture
def stores(tmp_path):
    made = [_store(tmp_path / "a"), _store(tmp_path / "b")]
    yield made
    for store in made:
        store.close()


class Shipped(list):
    weighed = 0  # batches the caller gave the weight of


def _ship(store):
    """What the store ships, each batch's weight as ``stored_bytes`` would give it (the caller's, when it knows it)."""
    shipped = Shipped()

    def ship(pid, seq, stored, size):
        assert size is None or size == stored_bytes(stored)
        shipped.weighed += size is not None
        shipped.append((pid, seq, stored, stored_bytes(stored) if size is None else size))
    for pid in range(P):
        store.partition(pid).shipper = ship
    return shipped


def test_a_batch_put_stages_at_once_what_piece_by_piece_would_and_ships_and_records_the_same(stores, monkeypatch):
    fast, slow = stores
    shipped = [_ship(fast), _ship(slow)]
    for pid in (0, 2):
        for store in stores:
            store.partition(pid).cut(record=True)  # a move under way records the partition's writes
    request = requests.new_id()
    groups = _groups(20)
    assert fast.write_all(groups, request) == [True] * 20
    monkeypatch.setattr("rockstate.store.store.stage_puts", lambda *a: None)  # the piece-by-piece path
    assert slow.write_all(groups, request) == [True] * 20
    for state in ("v", requests.REQUESTS, REPLICATION):
        assert _everything(fast, state) == _everything(slow, state)
    assert fast.partition(2).raw_get_one(REPLICATION, SEQ_KEY) == (1).to_bytes(8, "big")
    assert shipped[0] == shipped[1] and [s[:2] for s in shipped[0]] == [(pid, 1) for pid in range(0, 40, 2)]
    assert (shipped[0].weighed, shipped[1].weighed) == (20, 0)  # weighed by its shape at once, and the same
    assert [list(op) for op in shipped[0][1][2]] == [
        [RAW_PUT_MANY, "v", groups[1][1][0][2], groups[1][1][0][3]], [RAW_PUT, requests.REQUESTS, request, requests.WRITTEN]]
    for pid in (0, 2):
        assert fast.partition(pid).take_recorded() == slow.partition(pid).take_recorded() == [
            *groups[pid // 2][1], (PUT, requests.REQUESTS, request, requests.WRITTEN)]


def test_a_retried_batch_put_applies_only_to_the_partitions_it_has_not_reached(stores):
    store = stores[0]
    shipped = _ship(store)
    request, groups = requests.new_id(), _groups(10)
    assert store.write_all(groups[:4], request) == [True] * 4  # the first attempt reached four of them (a move between)
    changed = [(pid, [(PUT_MANY, "v", ops[0][2], [b"again"] * 3)]) for pid, ops in groups]
    assert store.write_all(changed, request) == [False] * 4 + [True] * 6
    assert store.partition(0).get_many("v", groups[0][1][0][2]) == groups[0][1][0][3]  # not written twice
    assert store.partition(18).get_many("v", groups[9][1][0][2]) == [b"again"] * 3
    assert [s[:2] for s in shipped[4:]] == [(pid, 1) for pid in range(8, 20, 2)]  # one batch each, none for the four
    assert store.write_all(changed, requests.new_id()) == [True] * 10  # another request applies everywhere again


@pytest.mark.parametrize("shape", ["two states", "ttl", "two ops"])
def test_pieces_of_two_states_and_the_shapes_that_go_piece_by_piece_end_as_piece_by_piece(stores, shape, monkeypatch):
    fast, slow = stores
    groups = _groups(6)
    if shape == "two states":
        groups += [(pid + 1, ops) for pid, ops in _groups(3, "w", b"-w")]
    elif shape == "ttl":
        groups = _groups(6, "t")
    else:
        groups[0] = (0, [*groups[0][1], (PUT, "w", b"k", b"x")])
    request = requests.new_id()
    assert fast.write_all(groups, request) == [True] * len(groups)
    monkeypatch.setattr("rockstate.store.store.stage_puts", lambda *a: None)
    assert slow.write_all(groups, request) == [True] * len(groups)
    for state in ("v", "w", requests.REQUESTS):
        assert _everything(fast, state) == _everything(slow, state)
    stamps = [v[:8] for pid in range(P) for _, v in fast.partition(pid).raw_items("t")]
    assert len(stamps) == (18 if shape == "ttl" else 0)  # a TTL state's values carry their expiry header


def test_a_key_that_is_not_bytes_fails_the_whole_request_and_writes_nothing(stores):
    store = stores[0]
    groups = _groups(5)
    groups[3][1][0][2][1] = "not bytes"
    with pytest.raises(ProtocolError, match="keys and values are bytes"):
        store.write_groups(groups, requests.new_id())
    assert all(not entries for entries in _everything(store, "v").values())
    assert store.write_all(_groups(5), requests.new_id()) == [True] * 5  # and it goes on serving


def _error(check, groups):
    try:
        check(groups)
    except Exception as e:  # noqa: BLE001 -- its type and message are compared
        return type(e), str(e)
    return None


BAD_PIECES = {  # a request whose pieces are all batch puts but one: what is wrong with that one
    "a key over the limit": lambda g: g[3][1][0][2].__setitem__(1, b"k" * 65),
    "a value over the limit": lambda g: g[5][1][0][3].__setitem__(0, b"v" * 129),
    "a key without a length": lambda g: g[2][1][0][2].__setitem__(0, 7),
    "a value without a length": lambda g: g[2][1][0][3].__setitem__(2, None),
    "fewer values than keys": lambda g: g[4][1][0][3].pop(),
    "keys not a list": lambda g: g.__setitem__(1, (g[1][0], [[PUT_MANY, "v", b"k", [b"x"]]])),
    "an unknown state": lambda g: g.__setitem__(6, (g[6][0], [[PUT_MANY, "nope", [b"k"], [b"x"]]])),
    "a state that is not a str": lambda g: g.__setitem__(6, (g[6][0], [[PUT_MANY, 3, [b"k"], [b"x"]]])),
    "an unknown op code": lambda g: g.__setitem__(0, (g[0][0], [[99, "v", [b"k"], [b"x"]]])),
    "an op of three": lambda g: g.__setitem__(7, (g[7][0], [[PUT_MANY, "v", [b"k"]]])),
    "ops not a list": lambda g: g.__setitem__(7, (g[7][0], "ops")),
}


@pytest.mark.parametrize("case", BAD_PIECES)
def test_a_batch_puts_pieces_checked_at_once_refuse_what_piece_by_piece_refuses_and_name_it_alike(tmp_path, case):
    store = Store(str(tmp_path / "s"), StoreConfig(partitions=P, max_key_bytes=64, max_value_bytes=128),
                  reserved=("_requests", "_replication"))
    try:
        store.define_state(StateSpec("v", "value"))
        store.define_state(StateSpec("w", "value"))

        def one_by_one(groups):
            for pid, ops in groups:
                check_ops(ops, store.specs, f"partition {pid}", 64, 128)

        groups = [(pid, [[PUT_MANY, "v", [k.encode() for k in keys], [b"x" * 100] * len(keys)]])
                  for pid, keys in [(pid, [f"2026-11-28T10:00:{pid:02d}|{i}" for i in range(3)]) for pid in range(8)]]
        assert check_put_pieces(groups, store.specs, 64, 128) and _error(store.check_ops, groups) is None
        assert not check_put_pieces([*groups, (9, [[PUT_MANY, "w", [b"k"], [b"x"]]])], store.specs, 64, 128)  # two states
        assert _error(store.check_ops, [*groups, (9, [[PUT_MANY, "w", [b"k"], [b"x"]]])]) is None  # each checked alone
        BAD_PIECES[case](groups)
        assert not check_put_pieces(groups, store.specs, 64, 128)
        refused = _error(store.check_ops, groups)
        assert refused is not None and refused == _error(one_by_one, groups)
        assert issubclass(refused[0], (ProtocolError, SizeLimitError, UnknownStateError))
    finally:
        store.close()


@pytest.mark.parametrize("request_id", [None, bytes(range(16))])
def test_a_runs_pieces_weigh_what_each_piece_as_an_item_weighs(request_id):
    # a backup keeps each piece of a run in its partition's tail weighed from running sums; the tails' memory bound
    # (kept_bytes) holds only if that is the weight ``stored_bytes`` gives the piece as the item it stands for
    counts = [1, 3, 2, 5]
    keys = [f"2026-11-28T10:00:{i:02d}|{('k' * i)}".encode() for i in range(sum(counts))]
    values = [b"v" * (7 * i) for i in range(sum(counts))]
    ends = [sum(counts[:i]) for i in range(len(counts) + 1)]
    items = [stored_piece("v", request_id, keys[a:b], values[a:b]) for a, b in zip(ends, ends[1:])]
    assert put_pieces_bytes(counts, keys, values, request_id, requests.WRITTEN) == list(map(stored_bytes, items))
    with pytest.raises(TypeError):
        put_pieces_bytes(counts, keys, [*values[:-1], 7], request_id, requests.WRITTEN)
