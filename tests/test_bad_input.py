"""Bad input, against a real cluster: each gets a clear typed error, the cluster keeps serving, nothing is lost.

One module-scoped cluster (a coordinator and two nodes as OS processes on
127.0.0.1, small size limits set through the coordinator's config) holds
some data written before any test runs. Each test sends one kind of bad
input, over the client API (``cluster.connect()``) or raw at the protocol
level (``Channel`` calls and hand-made frames on bare sockets), and checks
three things:

1. the exact rockstate error type, with a message that says what was wrong
   and what is allowed;
2. the same node and coordinator processes still serve (a write/read round
   trip through every partition, and a coordinator call);
3. the data written before is intact.
"""

from __future__ import annotations

import itertools
import os
import re
import socket
import struct
import subprocess
import sys

import msgpack
import pytest

from rockstate.cluster import protocol as p
from rockstate.config import CoordinatorConfig, NodeConfig, load
from rockstate.errors import (
    ConfigError,
    FrameTruncatedError,
    InvalidInputError,
    InvalidKeyError,
    InvalidNameError,
    InvalidValueError,
    PartitionRangeError,
    ProtocolError,
    ProtocolVersionError,
    SizeLimitError,
    StateKindError,
    UnknownOperationError,
    UnknownStateError,
)
from rockstate.rpc.client import Channel, split_address
from rockstate.rpc.frames import MAGIC, MAX_FRAME, encode, read_frame_sync
from rockstate.rpc.messages import PROTOCOL_VERSION, Message, Welcome, parse_reply
from rockstate.serde import KEY_TYPES, VALUE_TYPES, encode_key, encode_value, encode_values
from rockstate.store.partition import APPEND, DELETE, DELETE_MANY, PUT, PUT_MANY, RAW_PUT
from rockstate.testing.cluster import local_cluster

P = 8
MAX_KEY = 1024
MAX_VALUE = 256 * 1024

SEED_VALUES = {i: {"n": i, "s": f"v{i}"} for i in range(400)}
SEED_MAP = {f"field-{i}": i * 1.5 for i in range(50)}
SEED_LIST = ["a", 1, None, b"\x00", [1, 2]]
SEED_STATES = {"seed-values": "value", "seed-map": "map", "seed-list": "list", "raw-target": "value", "round-trip": "value",
               "raw-map": "map", "raw-list": "list", "raw-ttl": "value"}

NAME_RULE = "use 1-128 letters, digits, '_', '-' or '.', starting with a letter or digit, with no '..' and no path separators"

_round_trips = itertools.count()


# -- the cluster and what it holds --------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("bad-input-cluster"))
    settings = {"max_key_bytes": MAX_KEY, "max_value_bytes": MAX_VALUE}
    with local_cluster(processes=True, nodes=2, partitions=P, root=root, coordinator_settings=settings) as c:
        with c.connect() as rs:
            rs.value_state("seed-values").put_many(SEED_VALUES)
            rs.map_state("seed-map").put_all("user", SEED_MAP)
            rs.list_state("seed-list").extend(("user", 1), SEED_LIST)
            rs.value_state("raw-target", create=True)  # raw writes in these tests go here, never into the seed states
            rs.value_state("round-trip", create=True)  # fresh writes after each test
            rs.map_state("raw-map", create=True), rs.list_state("raw-list", create=True)  # raw writes of a kind
            rs.value_state("raw-ttl", ttl=3600, create=True)
        c.processes_at_start = sorted((n.node_id, n.pid) for n in c.nodes())
        yield c


@pytest.fixture(scope="module")
def rs(cluster):
    with cluster.connect() as client:
        yield client


def check_serving_and_intact(cluster, rs) -> None:
    """(2) the same processes serve reads and writes on every partition and the coordinator answers;
    (3) what was written before the tests is all there."""
    assert sorted((n.node_id, n.pid) for n in cluster.nodes()) == cluster.processes_at_start, "a node process died"
    status = rs.backend.status()
    assert [n["status"] for n in status["nodes"]] == ["alive", "alive"]
    assert status["states"] == len(SEED_STATES)  # no bad name got into the catalog
    rt = rs.value_state("round-trip")
    token = next(_round_trips)
    fresh = {(token, i): f"rt-{token}-{i}" for i in range(64)}  # 64 keys reach every one of the 8 partitions
    assert {rs.partition_of(k) for k in fresh} == set(range(P))
    rt.put_many(fresh)
    assert rt.get_many(list(fresh)) == list(fresh.values())
    assert rs.value_state("seed-values").get_many(list(SEED_VALUES)) == list(SEED_VALUES.values())
    assert rs.value_state("seed-values").count() == len(SEED_VALUES)
    assert dict(rs.map_state("seed-map").items("user")) == SEED_MAP
    assert rs.list_state("seed-list").get(("user", 1)) == SEED_LIST


def owned(rs, node_address: str) -> list[int]:
    table = rs.backend.refresh()
    return [pid for pid in range(P) if table.owner_address(pid) == node_address]


def first_node(cluster):
    return sorted(cluster.nodes(), key=lambda n: n.node_id)[0]


def raw_read(channel: Channel, rs, pid: int, keys: list[bytes], state: str = "raw-target") -> list:
    return channel.call(p.Read(epoch=rs.backend.table.epoch, state=state, pids=[pid], counts=[len(keys)], keys=keys))


# -- oversized keys and values ------------------------------------------------------


def test_limits_come_from_the_coordinator_config(cluster, rs):
    assert (rs.backend.max_key_bytes, rs.backend.max_value_bytes) == (MAX_KEY, MAX_VALUE)
    check_serving_and_intact(cluster, rs)


@pytest.mark.parametrize("where", ["value key", "tuple key", "map user key", "batch", "read"])
def test_key_over_max_key_bytes(cluster, rs, where):
    big = "k" * (MAX_KEY + 10)
    values = rs.value_state("seed-values")
    with pytest.raises(SizeLimitError) as info:
        if where == "value key":
            values.put(big, 1)
        elif where == "tuple key":
            values.put(("ok", big), 1)
        elif where == "map user key":
            rs.map_state("seed-map").put("user", big, 1)
        elif where == "batch":  # good keys with one oversized: nothing of the batch is written
            values.put_many({"fresh-1": 1, big: 2, "fresh-2": 3})
        else:
            values.get(big)
    err = info.value
    assert type(err) is SizeLimitError
    assert "key of" in err.message and f"over the limit of {MAX_KEY} bytes" in err.message
    assert err.data["limit"] == MAX_KEY
    assert values.get_many(["fresh-1", "fresh-2"]) == [None, None]
    check_serving_and_intact(cluster, rs)


def test_key_at_the_limit_is_accepted(cluster, rs):
    s = "k" * (MAX_KEY - 3)  # str8/str16 header: 3 bytes
    assert len(encode_key(s)) == MAX_KEY
    rs.value_state("round-trip").put(s, "at the limit")
    assert rs.value_state("round-trip").get(s) == "at the limit"
    check_serving_and_intact(cluster, rs)


@pytest.mark.parametrize("where", ["value", "batch", "map entry", "list append", "list extend"])
def test_value_over_max_value_bytes(cluster, rs, where):
    big = b"x" * (MAX_VALUE + 1)
    with pytest.raises(SizeLimitError) as info:
        if where == "value":
            rs.value_state("seed-values").put(1, big)
        elif where == "batch":
            rs.value_state("seed-values").put_many({1: "changed", 2: big})
        elif where == "map entry":
            rs.map_state("seed-map").put_all("user", {"field-1": "changed", "field-2": big})
        elif where == "list append":
            rs.list_state("seed-list").append(("user", 1), big)
        else:
            rs.list_state("seed-list").extend(("user", 1), ["changed", big])
    err = info.value
    assert type(err) is SizeLimitError
    assert "value of" in err.message and f"over the limit of {MAX_VALUE} bytes" in err.message
    assert err.data["limit"] == MAX_VALUE
    check_serving_and_intact(cluster, rs)  # key 1, field-1 and the list are unchanged


def test_value_at_the_limit_is_accepted(cluster, rs):
    value = b"v" * (MAX_VALUE - 5)  # bin32 header: 5 bytes
    assert len(encode_value(value)) == MAX_VALUE
    rs.value_state("round-trip").put("at-the-limit", value)
    assert rs.value_state("round-trip").get("at-the-limit") == value
    check_serving_and_intact(cluster, rs)


# -- oversized keys and values sent raw to a node, bypassing the client ---------------------
# The node holds what an op stores to the limits the client holds encoded keys and values to (the
# coordinator hands them to every node): a map entry's key is two encoded keys, so up to 2 * MAX_KEY;
# a list's value is its items' encodings concatenated, each item up to MAX_VALUE; a RAW_PUT to a
# state with a TTL carries an 8-byte expiry header on top.

BIG_KEY, BIG_VALUE = b"k" * (MAX_KEY + 1), b"v" * (MAX_VALUE + 1)


def _oversized(pid: int) -> dict:
    """case -> (the bad op or CAS group body, the limit it breaks, words of the message)."""
    item = encode_value(b"i" * (MAX_VALUE - 5 + 1))  # one encoded list item just over the limit
    key_words, value_words = "key of", "value of"
    return {
        "PUT key": ([PUT, "raw-target", BIG_KEY, b"v"], MAX_KEY, [key_words, f"{MAX_KEY + 1} bytes", "(max_key_bytes)"]),
        "PUT value": ([PUT, "raw-target", b"k", BIG_VALUE], MAX_VALUE, [value_words, "(max_value_bytes)"]),
        "PUT_MANY key": ([PUT_MANY, "raw-target", [b"k1", BIG_KEY, b"k3"], [b"1", b"2", b"3"]], MAX_KEY, [key_words]),
        "PUT_MANY value": ([PUT_MANY, "raw-target", [b"k1", b"k2"], [b"1", BIG_VALUE]], MAX_VALUE, [value_words]),
        "APPEND key": ([APPEND, "raw-list", BIG_KEY, encode_value(1)], MAX_KEY, [key_words]),
        "APPEND list item": ([APPEND, "raw-list", encode_key("l"), encode_value(1) + item], MAX_VALUE,
                             [value_words, "an item of the list", f"{len(item)} bytes"]),
        "RAW_PUT value": ([RAW_PUT, "raw-target", b"k", BIG_VALUE], MAX_VALUE, [value_words]),
        "RAW_PUT value after a TTL header": ([RAW_PUT, "raw-ttl", b"k", b"\x00" * 8 + BIG_VALUE], MAX_VALUE,
                                             [value_words, "after its 8-byte expiry header"]),
        "map entry key": ([PUT, "raw-map", b"m" * (2 * MAX_KEY + 1), b"v"], 2 * MAX_KEY,
                          [key_words, f"max_key_bytes={MAX_KEY} each"]),
    }


def _check_size_error(err, limit: int, words: list) -> None:
    assert type(err) is SizeLimitError, f"{type(err).__name__}: {err}"
    assert f"over the limit of {limit} bytes" in err.message, err.message
    assert err.data["limit"] == limit
    for w in words:
        assert w in err.message, err.message


@pytest.mark.parametrize("case", list(_oversized(0)))
@pytest.mark.parametrize("via", ["write", "stage"])
def test_oversized_raw_op_on_a_node(cluster, rs, case, via):
    """A Write or Stage straight to a node: the same SizeLimitError the client raises, naming the limit;
    no group of the request is applied (a good group before it, a good op before it in its own group),
    the connection and the node go on serving, and what was there is intact."""
    node = first_node(cluster)
    a, b = owned(rs, node.address)[:2]
    bad, limit, words = _oversized(b)[case]
    good = encode_key(("oversized", case, via))
    before = encode_key(("oversized-before", case, via))
    query = f"oversized-{case}"
    epoch = rs.backend.table.epoch
    groups = [[a, [[PUT, "raw-target", good, b"\x01"]]], [b, [[PUT, "raw-target", before, b"\x02"], bad]]]
    with Channel(node.address) as channel:
        with pytest.raises(SizeLimitError) as info:
            if via == "write":
                channel.call(p.Write(epoch=epoch, groups=groups))
            else:
                channel.call(p.Stage(epoch=epoch, query=query, batch=0, operator="op", attempt=0, seq=0, groups=groups))
        _check_size_error(info.value, limit, words)
        if via == "stage":  # nothing was staged: applying the batch applies nothing
            channel.call(p.StageDone(epoch=epoch, query=query, batch=0, operator="op", attempt=0, groups=[[a, 0], [b, 0]]))
            channel.call(p.Seal(epoch=epoch, query=query, batch=0, operator="op", groups=[[a, None], [b, None]]))
            channel.call(p.AdvanceBatches(epoch=epoch, query=query, batch=1, groups=[[a, None], [b, None]]))
        assert raw_read(channel, rs, a, [good]) == [None]
        assert raw_read(channel, rs, b, [before]) == [None]
        # the same connection still serves a write of the same shape within the limits
        channel.call(p.Write(epoch=epoch, groups=[[b, [[PUT, "raw-target", before, b"\x03"]]]]))
        assert raw_read(channel, rs, b, [before]) == [b"\x03"]
        channel.call(p.Write(epoch=epoch, groups=[[b, [[DELETE, "raw-target", before, None]]]]))
    check_serving_and_intact(cluster, rs)


@pytest.mark.parametrize("part", ["key", "new value"])
def test_oversized_raw_compare_and_set_on_a_node(cluster, rs, part):
    node = first_node(cluster)
    pid = owned(rs, node.address)[0]
    key = encode_key(("oversized-cas", part))
    epoch = rs.backend.table.epoch
    with Channel(node.address) as channel:
        channel.call(p.Write(epoch=epoch, groups=[[pid, [[PUT, "raw-target", key, b"old"]]]]))
        cas = ["raw-target", BIG_KEY, None, b"new"] if part == "key" else ["raw-target", key, b"old", BIG_VALUE]
        with pytest.raises(SizeLimitError) as info:
            channel.call(p.CompareAndSet(epoch=epoch, groups=[[pid, cas]]))
        _check_size_error(info.value, MAX_KEY if part == "key" else MAX_VALUE, ["compare-and-set"])
        assert raw_read(channel, rs, pid, [key, BIG_KEY]) == [b"old", None]  # not applied
        assert channel.call(p.CompareAndSet(epoch=epoch, groups=[[pid, ["raw-target", key, b"old", b"new"]]])) == [True]
        channel.call(p.Write(epoch=epoch, groups=[[pid, [[DELETE, "raw-target", key, None]]]]))
    check_serving_and_intact(cluster, rs)


def test_what_the_client_may_send_is_accepted_raw(cluster, rs):
    """The node's limits are not tighter than the client's: a map entry with a key and a user key at the
    limit each, a list longer than MAX_VALUE whose items are within it, a TTL value at the limit."""
    big_item = b"x" * (MAX_VALUE - 5)  # encodes to MAX_VALUE bytes
    at_limit = "k" * (MAX_KEY - 3)  # encodes to MAX_KEY bytes
    rs.map_state("raw-map").put(at_limit, at_limit, "both at the limit")
    assert rs.map_state("raw-map").get(at_limit, at_limit) == "both at the limit"
    rs.list_state("raw-list").extend("long", [big_item, big_item, 1])
    rs.list_state("raw-list").append("long", big_item)
    assert rs.list_state("raw-list").get("long") == [big_item, big_item, 1, big_item]
    rs.list_state("raw-list").put("long", [big_item] * 3)
    assert rs.list_state("raw-list").get("long") == [big_item] * 3
    ttl = rs.value_state("raw-ttl", ttl=3600)
    ttl.put("at-the-limit", big_item)
    assert ttl.get("at-the-limit") == big_item
    node = first_node(cluster)
    pid = owned(rs, node.address)[0]
    with Channel(node.address) as channel:  # raw: a TTL state's stored value is its header and a value at the limit
        stored = b"\xff" * 8 + encode_value(big_item)
        channel.call(p.Write(epoch=rs.backend.table.epoch, groups=[[pid, [[RAW_PUT, "raw-ttl", b"raw", stored]]]]))
        assert raw_read(channel, rs, pid, [b"raw"], state="raw-ttl") == [encode_value(big_item)]
        items = b"".join(encode_values([big_item, big_item]))  # a list value of two items at the limit
        channel.call(p.Write(epoch=rs.backend.table.epoch, groups=[[pid, [[PUT_MANY, "raw-list", [b"two"], [items]]]]]))
        assert raw_read(channel, rs, pid, [b"two"], state="raw-list") == [items]
    check_serving_and_intact(cluster, rs)


# -- unsupported key and value types ------------------------------------------------


class Opaque:
    pass


@pytest.mark.parametrize("key, named", [
    ([1, 2], "list"), ({"a": 1}, "dict"), ({1}, "set"), (Opaque(), "Opaque"), (1j, "complex"),
    (("a", [1]), "list"), (("a", ("nested",)), "tuple"), (2**64, "outside the signed 64-bit range"),
])
def test_unsupported_key_type(cluster, rs, key, named):
    values = rs.value_state("seed-values")
    for call in (lambda: values.put(key, 1), lambda: values.get(key),
                 lambda: values.put_many([("fresh-3", 1), (key, 2)]), lambda: values.get_many([1, key])):
        with pytest.raises(InvalidKeyError) as info:
            call()
        assert type(info.value) is InvalidKeyError
        assert named in info.value.message
        assert KEY_TYPES in info.value.message or "Spark bigint" in info.value.message
    assert values.get("fresh-3") is None  # the batch with a bad key wrote nothing
    check_serving_and_intact(cluster, rs)


@pytest.mark.parametrize("value, named", [
    ({1, 2}, "set"), (Opaque(), "Opaque"), (1j, "complex"), ([1, {2}], "list"), (2**64, "int"),
])
def test_unsupported_value_type(cluster, rs, value, named):
    for call in (lambda: rs.value_state("seed-values").put(3, value),
                 lambda: rs.value_state("seed-values").put_many({3: "changed", 4: value}),
                 lambda: rs.map_state("seed-map").put("user", "field-3", value),
                 lambda: rs.list_state("seed-list").append(("user", 1), value)):
        with pytest.raises(InvalidValueError) as info:
            call()
        assert type(info.value) is InvalidValueError
        assert f"value of type {named}" in info.value.message and VALUE_TYPES in info.value.message
    check_serving_and_intact(cluster, rs)


# -- unknown states, and a state used as the wrong kind -----------------------------------


def test_unknown_state_through_the_client(cluster, rs):
    key = encode_key("k")
    pid = rs.partition_of("k")
    calls = {
        "count (coordinator)": lambda: rs.backend.count("no-such-state"),
        "read (node)": lambda: rs.backend.get_many("no-such-state", {pid: [key]}),
        "write (node)": lambda: rs.backend.write({pid: [(PUT, "no-such-state", key, encode_value(1))]}),
        "scan (node)": lambda: rs.backend.scan("no-such-state", pid, b"", None, 10),
    }
    for what, call in calls.items():
        with pytest.raises(UnknownStateError) as info:
            call()
        err = info.value
        assert type(err) is UnknownStateError, what
        assert "no state 'no-such-state'" in str(err), what
        assert "value_state(), map_state() or list_state()" in str(err), what  # how to make one
    check_serving_and_intact(cluster, rs)


def test_a_read_of_a_state_that_does_not_exist_names_close_ones_and_defines_nothing(cluster, rs):
    reads = {"get": lambda: rs.value_state("seed-value").get("k"), "count": lambda: rs.map_state("seed-maps").count(),
             "scan": lambda: list(rs.list_state("seed-lists").keys()), "get_many": lambda: rs.value_state("values").get_many([1, 2])}
    for what, read in reads.items():
        with pytest.raises(UnknownStateError) as info:
            read()
        assert type(info.value) is UnknownStateError, what
        assert "did you mean 'seed-" in str(info.value) and "create=True" in str(info.value), (what, str(info.value))
        assert info.value.data["matches"], what
    check_serving_and_intact(cluster, rs)  # counts the states: none of the four was defined


def test_unknown_state_in_one_group_writes_no_group(cluster, rs):
    node = first_node(cluster)
    a, b = owned(rs, node.address)[:2]
    key = encode_key(("unknown-state-case", 1))
    with Channel(node.address) as channel:
        epoch = rs.backend.table.epoch
        with pytest.raises(UnknownStateError, match="no state 'no-such-state'") as info:
            channel.call(p.Write(epoch=epoch, groups=[[a, [[PUT, "raw-target", key, b"\x01"]]],
                                                     [b, [[PUT, "no-such-state", key, b"\x01"]]]]))
        assert type(info.value) is UnknownStateError
        assert raw_read(channel, rs, a, [key]) == [None]  # the valid group was not applied either
        channel.call(p.Write(epoch=epoch, groups=[[a, [[PUT, "raw-target", key, b"\x02"]]]]))
        assert raw_read(channel, rs, a, [key]) == [b"\x02"]  # the same connection still serves
        channel.call(p.Write(epoch=epoch, groups=[[a, [[DELETE, "raw-target", key, None]]]]))
    check_serving_and_intact(cluster, rs)


@pytest.mark.parametrize("reopen_as", ["map", "list", "value with a ttl"])
def test_value_state_reopened_as_another_kind(cluster, rs, reopen_as):
    with pytest.raises(StateKindError) as info:
        if reopen_as == "map":
            rs.map_state("seed-values")
        elif reopen_as == "list":
            rs.list_state("seed-values")
        else:
            rs.value_state("seed-values", ttl=60)
    err = info.value
    assert type(err) is StateKindError
    assert "state 'seed-values' is a value state (ttl=None)" in err.message  # what it is
    assert "cannot be opened as a" in err.message
    assert rs.value_state("seed-values").spec.kind == "value"
    check_serving_and_intact(cluster, rs)


def test_map_state_reopened_as_value_state_raw_on_a_node(cluster, rs):
    node = first_node(cluster)
    with Channel(node.address) as channel:
        with pytest.raises(StateKindError, match="state 'seed-map' is a map state .* cannot be opened as a value state"):
            channel.call(p.NodeDefineState(spec={"name": "seed-map", "kind": "value", "ttl": None}))
    check_serving_and_intact(cluster, rs)


# -- state names ------------------------------------------------------------------


BAD_NAMES = ["a/b", "/abs", "../escape", "a/../b", "a..b", "..", "a\\b", "_private", "", "x" * 129, "sp ace", "-dash"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_state_name_through_the_client(cluster, rs, name):
    for kind in (rs.value_state, rs.map_state, rs.list_state):
        with pytest.raises(InvalidNameError) as info:
            kind(name)
        assert type(info.value) is InvalidNameError
        assert f"invalid state name {name!r}" in info.value.message and NAME_RULE in info.value.message
    check_serving_and_intact(cluster, rs)


@pytest.mark.parametrize("name", ["a/b", "../escape", "..", "_../escape", "_a/b", 7, None])
@pytest.mark.parametrize("target", ["coordinator", "node"])
def test_bad_state_name_raw(cluster, rs, name, target):
    """Internal names ('_' then a name: pipelines' bookkeeping) follow the same character rules."""
    address, msg = ((cluster.address, p.DefineState) if target == "coordinator"
                    else (first_node(cluster).address, p.NodeDefineState))
    with Channel(address) as channel:
        with pytest.raises(InvalidNameError) as info:
            channel.call(msg(spec={"name": name, "kind": "value", "ttl": None}))
        assert type(info.value) is InvalidNameError
        assert f"invalid state name {name!r}" in info.value.message and NAME_RULE in info.value.message
    check_serving_and_intact(cluster, rs)


@pytest.mark.parametrize("spec", [{"kind": "value"}, {"name": "ok-name"}, {}])
def test_incomplete_state_spec_raw(cluster, rs, spec):
    with Channel(cluster.address) as channel:
        with pytest.raises(InvalidInputError) as info:
            channel.call(p.DefineState(spec=spec))
        assert type(info.value) is InvalidInputError
        assert "a state spec is" in info.value.message and "'name'" in info.value.message and "'kind'" in info.value.message
    check_serving_and_intact(cluster, rs)


# -- partitions out of range ---------------------------------------------------------


@pytest.mark.parametrize("pid", [P, -1, 1 << 40])
@pytest.mark.parametrize("op", ["write", "read", "scan"])
def test_partition_out_of_range_raw(cluster, rs, pid, op):
    node = first_node(cluster)
    good = owned(rs, node.address)[0]
    key = encode_key(("range-case", pid))
    epoch = rs.backend.table.epoch
    with Channel(node.address) as channel:
        with pytest.raises(PartitionRangeError) as info:
            if op == "write":  # the good group first: it must not be applied either
                channel.call(p.Write(epoch=epoch, groups=[[good, [[PUT, "raw-target", key, b"\x01"]]],
                                                         [pid, [[PUT, "raw-target", key, b"\x01"]]]]))
            elif op == "read":
                channel.call(p.Read(epoch=epoch, state="raw-target", pids=[good, pid], counts=[1, 1], keys=[key, key]))
            else:
                channel.call(p.Scan(epoch=epoch, partition=pid, state="raw-target"))
        err = info.value
        assert type(err) is PartitionRangeError
        assert f"partition {pid} is out of range 0..{P - 1}" == err.message
        assert raw_read(channel, rs, good, [key]) == [None]
    check_serving_and_intact(cluster, rs)


# -- numbers out of range: refused as the message is decoded, on a connection that keeps serving ------


def _out_of_range(epoch: int, pid: int) -> dict:
    """case -> (where, the message's wire form, the field, what the error says)."""
    scan = p.Scan(epoch=epoch, partition=pid, state="raw-target").to_wire()
    stage = p.Stage(epoch=epoch, query="range", batch=0, operator="op", attempt=0, seq=0, groups=[]).to_wire()
    finish = p.FinishTask(epoch=epoch, query="range", batch=0, operator="op", run="", task=0, tasks=1, pids=[], groups=[]).to_wire()
    chunk = p.IngestChunk(upload="x", offset=0, data=b"").to_wire()
    return {
        "scan limit -1": ("node", {**scan, "limit": -1}, "limit",
                          "field 'limit' of 'scan' message must be an int from 1 to 100000, not -1"),
        "scan limit 0": ("node", {**scan, "limit": 0}, "limit", "must be an int from 1 to 100000, not 0"),
        "scan limit 100001": ("node", {**scan, "limit": 100_001}, "limit", "must be an int from 1 to 100000, not 100001"),
        "stage batch -1": ("node", {**stage, "batch": -1}, "batch",
                           "field 'batch' of 'stage' message must be an int from 0 to 2**64 - 1, not -1"),
        "stage seq 2**32": ("node", {**stage, "seq": 1 << 32}, "seq",
                            "field 'seq' of 'stage' message must be an int from 0 to 2**32 - 1"),
        "finish task of 0 tasks": ("node", {**finish, "tasks": 0}, "tasks",
                                   "field 'tasks' of 'finish_task' message must be an int from 1 to 2**32 - 1, not 0"),
        "ingest chunk offset -1": ("node", {**chunk, "offset": -1}, "offset",
                                   "field 'offset' of 'ingest_chunk' message must be an int from 0 to 2**63 - 1, not -1"),
        "events wait -1": ("coordinator", {**p.Events().to_wire(), "wait": -1.0}, "wait",
                           "field 'wait' of 'events' message must be a finite number >= 0, not -1.0"),
        "events wait nan": ("coordinator", {**p.Events().to_wire(), "wait": float("nan")}, "wait",
                            "must be a finite number >= 0, not nan"),
        "get table wait 61": ("coordinator", {"op": "get_table", "newer_than": 0, "wait": 61.0}, "wait",
                              "field 'wait' of 'get_table' message must be a finite number from 0 to 60.0, not 61.0"),
        "get table newer than -1": ("coordinator", {"op": "get_table", "newer_than": -1, "wait": 1.0}, "newer_than",
                                    "field 'newer_than' of 'get_table' message must be an int from 0 to 2**63 - 1, not -1"),
        "inspect checkpoint -1": ("coordinator", {"op": "inspect_checkpoint", "checkpoint": -1}, "checkpoint",
                                  "field 'checkpoint' of 'inspect_checkpoint' message must be an int from 0 to 2**63 - 1"),
    }


@pytest.mark.parametrize("case", list(_out_of_range(0, 0)))
def test_number_out_of_range_raw(cluster, rs, case):
    """Hand-made frames (the message classes refuse to make these): a ProtocolError naming the field and
    what it allows, for that request only; the same connection serves the next one."""
    node = first_node(cluster)
    target, wire, field, says = _out_of_range(rs.backend.table.epoch, owned(rs, node.address)[0])[case]
    with pytest.raises(ProtocolError, match=re.escape(says)):  # what the server does with it, done here
        Message.from_wire(wire)
    with RawPeer(_target(cluster, target)) as peer:
        assert isinstance(peer.hello()[1], Welcome)
        peer.send({"id": 1, "msg": wire, "deadline": None})
        rid, err = peer.reply()
        assert rid == 1 and type(err) is ProtocolError, f"{type(err).__name__}: {err}"
        assert says in err.message, err.message
        assert err.data == {"op": wire["op"], "field": field}
        after = p.Status() if target == "coordinator" else p.NodeCount(state="raw-target")
        peer.send({"id": 2, "msg": after.to_wire(), "deadline": None})
        rid, answer = peer.reply()
        assert rid == 2 and not isinstance(answer, Exception), answer
    check_serving_and_intact(cluster, rs)


def test_scan_with_negative_limit(cluster, rs):
    """It used to answer one entry; now a ProtocolError saying what a limit may be."""
    rs.value_state("raw-target").put("scan-case", 1)
    pid = rs.partition_of("scan-case")
    scan = p.Scan(epoch=rs.backend.table.epoch, partition=pid, state="raw-target").to_wire()
    with RawPeer(rs.backend.refresh().owner_address(pid)) as peer:
        assert isinstance(peer.hello()[1], Welcome)
        peer.send({"id": 1, "msg": {**scan, "limit": -1}, "deadline": None})
        rid, err = peer.reply()
        assert rid == 1 and type(err) is ProtocolError, f"{type(err).__name__}: {err}"
        assert err.message == "field 'limit' of 'scan' message must be an int from 1 to 100000, not -1"
        peer.send({"id": 2, "msg": {**scan, "limit": 1}, "deadline": None})
        rid, page = peer.reply()
        assert rid == 2 and len(page) == 1  # the same connection scans on
    with pytest.raises(ProtocolError, match="field 'limit' of 'scan' message must be an int from 1 to 100000, not -1"):
        p.Scan(epoch=0, partition=pid, state="raw-target", limit=-1)  # refused before it is sent, too
    check_serving_and_intact(cluster, rs)


def test_freeze_of_a_partition_out_of_range_raw(cluster, rs):
    with Channel(first_node(cluster).address) as channel:
        with pytest.raises(PartitionRangeError, match=f"partition -1 is out of range 0..{P - 1}"):
            channel.call(p.Freeze(partition=-1))
    check_serving_and_intact(cluster, rs)


# -- wrong field types and malformed message bodies, on one connection that keeps serving -------


def _wrong_fields(epoch: int, pid: int) -> dict:
    k = encode_key("wrong-field")
    return {
        "epoch as str": (p.Write(epoch=str(epoch), groups=[]), "field 'epoch' of 'write' message must be int, not str"),
        "groups as dict": (p.Write(epoch=epoch, groups={}), "field 'groups' of 'write' message must be list, not dict"),
        "state as int": (p.Read(epoch=epoch, state=5, pids=[], counts=[], keys=[]), "field 'state' of 'read' message must be str, not int"),
        "prefix as str": (p.Scan(epoch=epoch, partition=pid, state="raw-target", prefix="x"),
                          "field 'prefix' of 'scan' message must be bytes, not str"),
        "group not a pair": (p.Write(epoch=epoch, groups=[[pid]]), "[[partition, "),
        "group not a list": (p.Write(epoch=epoch, groups=[5]), "[[partition, "),
        "partition as list": (p.Read(epoch=epoch, state="raw-target", pids=[[pid]], counts=[1], keys=[k]), "a partition and a count"),
        "read counts not adding up": (p.Read(epoch=epoch, state="raw-target", pids=[pid], counts=[2], keys=[k]), "adding up"),
        "read count of 0": (p.Read(epoch=epoch, state="raw-target", pids=[pid, pid], counts=[0, 1], keys=[k]), "(>= 1)"),
        "ops not a list": (p.Write(epoch=epoch, groups=[[pid, 5]]), "ops of partition"),
        "op too short": (p.Write(epoch=epoch, groups=[[pid, [[PUT, "raw-target"]]]]), "an op is [code, state, key, value]"),
        "unknown op code": (p.Write(epoch=epoch, groups=[[pid, [[99, "raw-target", k, b"v"]]]]), "unknown op code 99"),
        "state of an op as int": (p.Write(epoch=epoch, groups=[[pid, [[PUT, 5, k, b"v"]]]]), "state of op 0"),
        "value as str": (p.Write(epoch=epoch, groups=[[pid, [[PUT, "raw-target", k, "str"]]]]), "value of op 0"),
        "key as int": (p.Write(epoch=epoch, groups=[[pid, [[PUT, "raw-target", 5, b"v"]]]]), "key of op 0"),
        "put_many with a single key": (p.Write(epoch=epoch, groups=[[pid, [[PUT_MANY, "raw-target", k, [b"v"]]]]]),
                                       "key of op 0"),
        "put_many lengths differ": (p.Write(epoch=epoch, groups=[[pid, [[PUT_MANY, "raw-target", [k, k], [b"v"]]]]]),
                                    "2 keys and 1 values"),
        "delete_many of ints": (p.Write(epoch=epoch, groups=[[pid, [[DELETE_MANY, "raw-target", [1, 2], None]]]]),
                                "keys and values are bytes"),
        "put_many of str values": (p.Write(epoch=epoch, groups=[[pid, [[PUT_MANY, "raw-target", [k], ["v"]]]]]),
                                   "keys and values are bytes"),
        "read keys not a list": (p.Read(epoch=epoch, state="raw-target", pids=[pid], counts=[3], keys="abc"),
                                 "field 'keys' of 'read' message must be list"),
        "read keys as ints": (p.Read(epoch=epoch, state="raw-target", pids=[pid], counts=[2], keys=[1, 2]), "keys and values are bytes"),
        "runs counts not adding up": (p.WriteRuns(epoch=epoch, state="raw-target", pids=[pid], counts=[2], keys=[k], values=[b"v"]),
                                      "adding up"),
        "runs with fewer values than keys": (p.WriteRuns(epoch=epoch, state="raw-target", pids=[pid], counts=[2], keys=[k, k],
                                                         values=[b"v"]), "a value per key or none"),
        "runs values not a list": (p.WriteRuns(epoch=epoch, state="raw-target", pids=[pid], counts=[1], keys=[k], values="v"),
                                   "field 'values' of 'write_runs' message must be list"),
        "runs keys as ints": (p.WriteRuns(epoch=epoch, state="raw-target", pids=[pid], counts=[2], keys=[1, 2], values=[b"v", b"v"]),
                              "keys and values are bytes"),
        "runs values as str": (p.WriteRuns(epoch=epoch, state="raw-target", pids=[pid], counts=[1], keys=[k], values=["v"]),
                               "keys and values are bytes"),
    }


# The items inside PUT_MANY / DELETE_MANY lists are checked as their group is applied (checking every
# key up front would cost on the hot path): such a group writes nothing, but groups before it in the
# same request may have been applied.
CHECKED_AS_APPLIED = {"delete_many of ints", "put_many of str values"}


CASES = list(_wrong_fields(0, 0))


@pytest.mark.parametrize("case", CASES)
def test_wrong_field_type_raw(cluster, rs, case):
    node = first_node(cluster)
    a, b = owned(rs, node.address)[:2]
    key = encode_key(("wrong-field-case", case))
    epoch = rs.backend.table.epoch
    msg, says = _wrong_fields(epoch, b)[case]
    with Channel(node.address) as channel:
        if isinstance(msg, p.Write) and isinstance(msg.groups, list) and case not in CHECKED_AS_APPLIED:
            # a valid group before the bad one: it must not be applied either
            msg.groups.insert(0, [a, [[PUT, "raw-target", key, b"\x01"]]])
        if isinstance(msg, p.WriteRuns) and isinstance(msg.values, list) and len(msg.values) == len(msg.keys):
            msg.pids.insert(0, a)  # a valid run before the bad one: it must not be applied either
            msg.counts.insert(0, 1)
            msg.keys.insert(0, key)
            msg.values.insert(0, b"\x01")
        with pytest.raises(ProtocolError) as info:
            channel.call(msg)
        err = info.value
        assert type(err) is ProtocolError, f"{type(err).__name__}: {err}"
        assert says in err.message
        assert raw_read(channel, rs, a, [key]) == [None]  # nothing of the request was applied,
        assert raw_read(channel, rs, b, [encode_key("wrong-field")]) == [None]  # and the connection serves on
    check_serving_and_intact(cluster, rs)


def test_unknown_operation_raw(cluster, rs):
    node = first_node(cluster)
    with RawPeer(node.address) as peer:
        assert isinstance(peer.hello()[1], Welcome)
        peer.send({"id": 1, "msg": {"op": "drop_everything"}, "deadline": None})
        rid, err = peer.reply()
        assert rid == 1 and type(err) is UnknownOperationError and "unknown operation 'drop_everything'" in err.message
        peer.send({"id": 2, "msg": p.GetTable().to_wire(), "deadline": None})  # a coordinator operation, on a node
        rid, err = peer.reply()
        assert rid == 2 and type(err) is UnknownOperationError and "server 'node' has no handler for 'get_table'" in err.message
        peer.send({"id": 3, "msg": p.NodeCount(state="seed-values").to_wire(), "deadline": None})
        rid, count = peer.reply()
        assert rid == 3 and isinstance(count, int)  # the connection still serves
    check_serving_and_intact(cluster, rs)


# -- malformed frames and an unknown protocol version, on bare sockets ---------------------------


class RawPeer:
    """A bare socket that writes frames (or bytes) by hand."""

    def __init__(self, address: str) -> None:
        self.sock = socket.create_connection(split_address(address), timeout=10)
        self.stream = self.sock.makefile("rb")
        self.sock.sendall(MAGIC)
        assert self.stream.read(len(MAGIC)) == MAGIC

    def hello(self, version: object = PROTOCOL_VERSION) -> tuple:
        self.send({"id": 0, "msg": {"op": "hello", "version": version, "name": "bad-input-test"}, "deadline": None})
        return self.reply()

    def send(self, obj: object) -> None:
        self.sock.sendall(encode(obj))

    def reply(self) -> tuple:
        return parse_reply(read_frame_sync(self.stream))

    def closed_by_peer(self) -> bool:
        return self.stream.read(1) == b""

    def __enter__(self) -> "RawPeer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stream.close()
        self.sock.close()


def _body(obj: object) -> bytes:
    data = msgpack.packb(obj, use_bin_type=True)
    return struct.pack(">I", len(data)) + data


FRAMES = {
    "garbage body": (struct.pack(">I", 4) + b"\xc1\xc1\xc1\xc1", ProtocolError,
                     ["undecodable frame of 4 bytes", "msgpack"]),
    "header over the max frame size": (struct.pack(">I", MAX_FRAME + 1), ProtocolError,
                                       [f"frame of {MAX_FRAME + 1} bytes exceeds the limit of {MAX_FRAME} bytes"]),
    "header of 4 GiB": (b"\xff\xff\xff\xff", ProtocolError, [f"exceeds the limit of {MAX_FRAME} bytes"]),
    "truncated body": (struct.pack(">I", 100) + b"only ten b", FrameTruncatedError,
                       ["truncated frame: connection closed after 10 of 100 bytes"]),
    "truncated header": (b"\x00\x00", FrameTruncatedError, ["truncated frame: connection closed after 2 header bytes"]),
    "not a map": (_body([1, 2, 3]), ProtocolError, ["a request must be a map", "not list"]),
    "a bare value": (_body(42), ProtocolError, ["a request must be a map", "not int"]),
    "map without a message": (_body({"id": 1}), ProtocolError, ["request 1 carries no message map"]),
    "request id not an int": (_body({"id": "one", "msg": {}}), ProtocolError, ["request id must be an int, not str"]),
}


def _target(cluster, target: str) -> str:
    return cluster.address if target == "coordinator" else first_node(cluster).address


@pytest.mark.parametrize("after_hello", [False, True], ids=["before hello", "after hello"])
@pytest.mark.parametrize("frame", list(FRAMES))
@pytest.mark.parametrize("target", ["node", "coordinator"])
def test_malformed_frame(cluster, rs, target, frame, after_hello):
    data, error_type, says = FRAMES[frame]
    with RawPeer(_target(cluster, target)) as peer:
        if after_hello:
            assert isinstance(peer.hello()[1], Welcome)
        peer.sock.sendall(data)
        if error_type is FrameTruncatedError:
            peer.sock.shutdown(socket.SHUT_WR)  # the frame ends early: the peer closes its side
        rid, err = peer.reply()  # the server's last word about the whole connection...
        assert rid is None and type(err) is error_type, f"{type(err).__name__}: {err}"
        for words in says:
            assert words in err.message
        assert peer.closed_by_peer()  # ...then it closes that connection, and only that one
    check_serving_and_intact(cluster, rs)


@pytest.mark.parametrize("version", [99, 0, "1", None])
@pytest.mark.parametrize("target", ["node", "coordinator"])
def test_unknown_protocol_version(cluster, rs, target, version):
    with RawPeer(_target(cluster, target)) as peer:
        rid, err = peer.hello(version=version)
        assert rid is None and type(err) is ProtocolVersionError
        assert f"client speaks protocol version {version!r}" in err.message
        assert f"speaks version {PROTOCOL_VERSION}" in err.message  # both versions named
        assert err.data == {"client_version": version, "server_version": PROTOCOL_VERSION}
        assert peer.closed_by_peer()
    check_serving_and_intact(cluster, rs)


@pytest.mark.parametrize("target", ["node", "coordinator"])
def test_request_before_hello(cluster, rs, target):
    with RawPeer(_target(cluster, target)) as peer:
        peer.send({"id": 1, "msg": p.Status().to_wire(), "deadline": None})
        rid, err = peer.reply()
        assert rid is None and type(err) is ProtocolError and "expected 'hello' first, got 'status'" in err.message
        assert peer.closed_by_peer()
    check_serving_and_intact(cluster, rs)


def test_connection_closed_mid_frame_leaves_other_connections_alone(cluster, rs):
    """A client that dies mid-frame: the node drops that connection; a connection open meanwhile goes on."""
    node = first_node(cluster)
    pid = owned(rs, node.address)[0]
    with Channel(node.address) as bystander:
        assert raw_read(bystander, rs, pid, [encode_key("nobody")]) == [None]
        for _ in range(5):
            with RawPeer(node.address) as peer:
                assert isinstance(peer.hello()[1], Welcome)
                peer.sock.sendall(struct.pack(">I", 1000) + b"partial")  # ...and the socket closes here
        assert raw_read(bystander, rs, pid, [encode_key("nobody")]) == [None]
    check_serving_and_intact(cluster, rs)


# -- bad configuration -----------------------------------------------------------------


def run_cli(*args: str, cwd: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rockstate.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


@pytest.fixture
def yaml_file(tmp_path):
    def write(text: str) -> str:
        path = tmp_path / "settings.yaml"
        path.write_text(text)
        return str(path)
    return write


CLI_CASES = {
    "node port out of range": (["node", "--port", "99999"], None, None,
                               ["invalid NodeConfig", "port", "less than or equal to 65535", "99999"]),
    "node memory too small": (["node", "--memory-bytes", "1000"], None, None,
                              ["invalid NodeConfig", "memory_bytes", "greater than or equal to 8388608", "1000"]),
    "coordinator zero partitions": (["coordinator", "--partitions", "0"], None, None,
                                    ["invalid CoordinatorConfig", "partitions", "greater than or equal to 1", "0"]),
    "env var not a number": (["node"], None, {"ROCKSTATE_HEARTBEAT_INTERVAL": "often"},
                             ["invalid NodeConfig", "heartbeat_interval", "valid number", "often"]),
    "invalid YAML": (["node"], "port: [1, 2\nhost: x\n", None, ["is not valid YAML", "line"]),
    "YAML not a mapping": (["node"], "- port\n- 1\n", None, ["must be a mapping of setting: value", "not a list"]),
    "unknown setting in YAML": (["node"], "prot: 7701\n", None, ["prot", "unknown setting", "port", "data_dir"]),
    "missing config file": (["node"], "", None, ["cannot read config file", "No such file"]),
}


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_bad_config_through_the_cli(cluster, rs, tmp_path, yaml_file, case):
    args, yaml_text, env, says = CLI_CASES[case]
    data_dir = tmp_path / "would-be-data"
    args = [*args, "--data-dir", str(data_dir)]
    if args[0] == "node":
        args += ["--coordinator", cluster.address]  # it would join this cluster if its config were valid
    if yaml_text is not None:
        path = yaml_file(yaml_text) if yaml_text else str(tmp_path / "missing.yaml")
        args += ["--config", path]
    result = run_cli(*args, cwd=str(tmp_path), env=env)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("rockstate: error: "), result.stderr
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1  # one plain line
    for words in says:
        assert words in result.stderr, result.stderr
    assert not data_dir.exists()  # refused before anything was created
    assert len(rs.backend.status()["nodes"]) == 2  # and it never joined
    check_serving_and_intact(cluster, rs)


def test_unparsable_flag_through_the_cli(cluster, rs, tmp_path):
    result = run_cli("node", "--port", "seventy", cwd=str(tmp_path))
    assert result.returncode == 64  # a usage error (sysexits EX_USAGE): 1 and 2 are rockstate status verdicts
    assert "argument --port: invalid int value: 'seventy'" in result.stderr and "Traceback" not in result.stderr
    check_serving_and_intact(cluster, rs)


LOAD_CASES = {
    "value out of range": (NodeConfig, None, {"port": 99999}, ["port", "less than or equal to 65535", "99999"]),
    "wrong type": (CoordinatorConfig, None, {"heartbeat_timeout": "soon"}, ["heartbeat_timeout", "valid number", "soon"]),
    "several at once": (NodeConfig, None, {"port": -1, "memory_bytes": 0}, ["port", "memory_bytes", "; "]),
    "invalid YAML": (NodeConfig, "port: 1\n  host: [\n", {}, ["is not valid YAML", "line"]),
    "YAML scalar": (NodeConfig, "just a string\n", {}, ["must be a mapping of setting: value", "not a str"]),
    "unknown setting": (CoordinatorConfig, "partitons: 12\n", {}, ["partitons", "unknown setting", "partitions"]),
    "unknown setting as override": (NodeConfig, None, {"colour": "blue"}, ["colour", "unknown setting", "heartbeat_interval"]),
    "missing file": (NodeConfig, "", {}, ["cannot read config file"]),
}


@pytest.mark.parametrize("case", list(LOAD_CASES))
def test_bad_config_through_load(cluster, rs, tmp_path, yaml_file, case):
    model, yaml_text, overrides, says = LOAD_CASES[case]
    path = None if yaml_text is None else (yaml_file(yaml_text) if yaml_text else str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError) as info:
        load(model, path, **overrides)
    err = info.value
    assert type(err) is ConfigError
    assert "\n" not in err.message
    for words in says:
        assert words in err.message, err.message
    check_serving_and_intact(cluster, rs)
