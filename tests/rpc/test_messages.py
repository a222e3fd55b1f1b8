from typing import Any

import pytest

from rockstate.errors import ProtocolError, UnknownOperationError
from rockstate.rpc.messages import Hello, Message, Welcome, parse_reply, parse_request, reply, request


class Put(Message):
    op = "test.messages.put"
    partition: int
    key: bytes
    value: bytes | None
    ratio: float = 1.0
    tags: list[str] | None = None
    meta: dict[str, Any] | None = None


def test_round_trip():
    msg = Put(partition=3, key=b"k", value=None, tags=["a"])
    wire = msg.to_wire()
    assert wire == {"op": "test.messages.put", "partition": 3, "key": b"k", "value": None,
                    "ratio": 1.0, "tags": ["a"], "meta": None}
    assert Message.from_wire(wire) == msg
    assert Put.from_wire(wire) == msg


def test_defaults_may_be_left_out_and_floats_take_ints():
    assert Message.from_wire({"op": Put.op, "partition": 1, "key": b"", "value": b"", "ratio": 2}) == Put(
        partition=1, key=b"", value=b"", ratio=2)


@pytest.mark.parametrize(("wire", "field"), [
    ({"partition": 1, "key": b"k"}, "value"),
    ({"partition": 1, "key": b"k", "value": None, "extra": 1}, "extra"),
    ({"partition": "1", "key": b"k", "value": None}, "partition"),
    ({"partition": True, "key": b"k", "value": None}, "partition"),
    ({"partition": 1, "key": "k", "value": None}, "key"),
    ({"partition": 1, "key": b"k", "value": 5}, "value"),
    ({"partition": 1, "key": b"k", "value": None, "tags": "a"}, "tags"),
])
def test_bad_fields_are_named(wire, field):
    with pytest.raises(ProtocolError, match=repr(field)) as info:
        Message.from_wire({"op": Put.op, **wire})
    assert info.value.data["field"] == field


def test_unknown_op_and_wrong_class():
    with pytest.raises(UnknownOperationError, match="'nope'"):
        Message.from_wire({"op": "nope"})
    with pytest.raises(UnknownOperationError):
        Message.from_wire({"op": [1]})
    with pytest.raises(ProtocolError, match="expected a 'welcome' message"):
        Welcome.from_wire(Hello(version=1, name="x").to_wire())
    with pytest.raises(ProtocolError, match="must be a map"):
        Message.from_wire([1])


def test_class_definition_is_checked():
    with pytest.raises(TypeError, match="must set op"):
        class NoOp(Message):
            x: int
    with pytest.raises(TypeError, match="is taken by Put"):
        class Again(Message):
            op = Put.op
    with pytest.raises(TypeError, match="not a msgpack-native type"):
        class Tupled(Message):
            op = "test.messages.tupled"
            pair: tuple


def test_envelopes():
    frame = request(7, Hello(version=1, name="n"), 1.5)
    assert parse_request(frame) == (7, {"op": "hello", "version": 1, "name": "n"}, 1.5)
    assert parse_reply(reply(7, [1, 2])) == (7, [1, 2])
    assert parse_reply(reply(7, Welcome(name="s"))) == (7, Welcome(name="s"))
    for bad in ([1], {"msg": {}}, {"id": "1", "msg": {}}, {"id": 1}, {"id": 1, "msg": {}, "deadline": "soon"}):
        with pytest.raises(ProtocolError):
            parse_request(bad)
