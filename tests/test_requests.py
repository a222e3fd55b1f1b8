"""Request ids on a partition (store/requests.py): a repeated request applies once, a compare-and-set's retry
gets its first outcome, ids are forgotten after the window, and the copies that moves and checkpoints take
hold them."""

import time

import pytest

from rockstate.config import StoreConfig
from rockstate.errors import ProtocolError
from rockstate.serde import decode_stream, encode_key, encode_value
from rockstate.store import APPEND, PUT, StateSpec, Store, requests


@pytest.fixture
def store(tmp_path):
    store = Store(str(tmp_path / "s"), StoreConfig(partitions=1, request_window=60))
    store.define_state(StateSpec("l", "list"))
    store.define_state(StateSpec("v", "value"))
    yield store
    store.close()


def append(item):
    return [(APPEND, "l", encode_key("k"), encode_value(item))]


def items(part):
    return list(decode_stream(part.get_many("l", [encode_key("k")])[0] or b""))


def test_a_repeated_request_applies_once_and_another_applies_again(store):
    part, first, second = store.partition(0), requests.new_id(), requests.new_id()
    assert store.write(0, append(1), first) is True
    assert store.write(0, append(1), first) is False
    assert items(part) == [1]
    assert store.write(0, append(2), second) is True
    assert store.write(0, append(3), None) and store.write(0, append(3), None)  # no id: applied every time
    assert items(part) == [1, 2, 3, 3]


def test_a_retried_compare_and_set_answers_with_its_first_outcome(store):
    part, key = store.partition(0), encode_key("c")
    applied, refused = requests.new_id(), requests.new_id()
    assert part.compare_and_set("v", key, None, encode_value("mine"), applied) is True
    part.write([(PUT, "v", key, encode_value("later"))])  # another client's write after it
    assert part.compare_and_set("v", key, None, encode_value("mine"), applied) is True
    assert part.get_many("v", [key]) == [encode_value("later")]  # not set again
    assert part.compare_and_set("v", key, encode_value("other"), encode_value("x"), refused) is False
    part.write([(PUT, "v", key, encode_value("other"))])
    assert part.compare_and_set("v", key, encode_value("other"), encode_value("x"), refused) is False
    assert part.get_many("v", [key]) == [encode_value("other")]


def test_ids_are_forgotten_after_the_window_and_kept_within_it(store):
    part, old = store.partition(0), requests.new_id()
    store.write(0, append("a"), old)
    store.forget_requests(now=time.time() + 59)  # within the 60 s window
    assert store.write(0, append("a"), old) is False
    store.forget_requests(now=time.time() + 61)
    assert store.write(0, append("a"), old) is True  # forgotten: a retry this late applies again
    assert items(part) == ["a", "a"]


def test_the_copy_a_move_or_checkpoint_takes_holds_the_ids_and_a_move_hands_over_later_ones(store, tmp_path):
    part, before, after = store.partition(0), requests.new_id(), requests.new_id()
    store.write(0, append("before"), before)
    part.export_copy(str(tmp_path / "copy"), record=True)
    store.write(0, append("after"), after)
    handed_over = part.take_recorded()
    other = Store(str(tmp_path / "other"), StoreConfig(partitions=store.partitions), owned=[])
    try:
        other.replace_partitions({0: (str(tmp_path / "copy"), 0)}, {n: s.to_dict() for n, s in store.specs.items()})
        copy = other.partition(0)
        copy.write(handed_over)
        for request, item in ((before, "before"), (after, "after")):
            assert copy.write(append(item), request) is False
        assert items(copy) == ["before", "after"]
    finally:
        other.close()


@pytest.mark.parametrize("bad", [b"short", b"x" * 17, "a str of sixteen", 16])
def test_a_malformed_request_id_is_refused(bad):
    with pytest.raises(ProtocolError, match=r"'request' of 'write' message must be None or 16 bytes"):
        requests.check_id(bad, "write")
