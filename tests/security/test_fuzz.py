"""Property-based fuzzing (hypothesis) of what comes from outside: frames before and after the handshake, message
validation, manifest and _metadata parsing. Bounded for ``make test`` (a few seconds); ``ROCKSTATE_FUZZ_EXAMPLES``
runs more (``make fuzz``). Every input must end in a typed ``RockstateError`` (or be accepted): never another
exception, never a file outside its folder. Findings are kept below as explicit examples (regressions).
"""

from __future__ import annotations

import json
import os
import struct

import msgpack
from hypothesis import HealthCheck, example, given, settings, strategies as st

from rockstate.checkpoint.manifest import CheckpointMetadata, PartitionManifest
from rockstate.checkpoint.signing import checkpoint_key, sign
from rockstate.cluster import protocol as p  # noqa: F401 -- registers every message class
from rockstate.errors import CorruptCheckpointError, RockstateError
from rockstate.names import is_name
from rockstate.rpc.frames import decode
from rockstate.rpc.messages import Message, _registry, parse_request

EXAMPLES = int(os.environ.get("ROCKSTATE_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=not os.environ.get("ROCKSTATE_FUZZ_EXAMPLES"))

scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(1 << 64), max_value=(1 << 64) - 1),
                    st.floats(allow_nan=True), st.text(max_size=40), st.binary(max_size=40))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=10), inner, max_size=4)), max_leaves=20)
json_values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70), st.floats(allow_nan=False),
                                     st.text(max_size=20)),
                           lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                           max_leaves=10)
names = st.one_of(st.sampled_from(["node-1", "..", ".", "../x", "/abs", "a/b", "", "x" * 129, "[b]x[/b]", "a..b", "-x",
                                   "000012.sst", "CURRENT", "MANIFEST-000005", "ok.name_1"]), st.text(max_size=30))


@FUZZ
@given(st.sampled_from(sorted(_registry)), st.dictionaries(st.sampled_from(
    ["node_id", "node", "state", "name", "upload", "base", "savepoint", "partition", "checkpoint", "epoch", "address",
     "zone", "items", "partitions", "offset", "data", "size", "checksum", "spec", "table", "limit", "after", "wait",
     "groups", "digest", "nonce", "version"]), st.one_of(values, names), max_size=6))
def test_any_message_map_is_accepted_or_refused_with_a_typed_error(op, fields):
    try:
        msg = Message.from_wire({**fields, "op": op})
    except RockstateError:
        return
    for field, what in getattr(type(msg), "names", {}).items():  # an accepted message holds only valid names
        value = getattr(msg, field)
        assert value is None or is_name(value), (op, field, value)
    if hasattr(msg, "base"):
        assert msg.base == "" or (msg.base.startswith("savepoints/") and is_name(msg.base[len("savepoints/"):]))


@FUZZ
@given(st.binary(max_size=200))
@example(b"\xc1\xc1\xc1\xc1")
@example(b"\xdd\xff\xff\xff\xff")  # an array of 4 G elements announced in 5 bytes
@example(b"\xdf\xff\xff\xff\xff")
def test_any_frame_body_decodes_or_is_refused_with_a_typed_error(body):
    try:
        frame = decode(body)
    except RockstateError:
        return
    try:
        parse_request(frame)
    except RockstateError:
        pass


@FUZZ
@given(values)
def test_any_request_envelope_is_parsed_or_refused(frame):
    try:
        rid, wire, _ = parse_request(frame)
        Message.from_wire(wire)
    except RockstateError:
        pass


file_entries = st.fixed_dictionaries({"name": names, "path": st.one_of(names, st.sampled_from(
    ["shared/p0000/a.sst", "/etc/x", "../../x", "shared//x", "chk-000001/p0000/CURRENT"])),
    "size": st.one_of(st.integers(-5, 10), st.text(max_size=3)), "checksum": st.text(max_size=12), "shared": st.booleans()})


@FUZZ
@given(st.lists(file_entries, max_size=4), st.one_of(st.integers(0, 3), st.text(max_size=3)), json_values)
def test_any_manifest_is_parsed_with_safe_names_or_refused_as_corrupt(files, partition, extra):
    doc = {"partition": partition, "checkpoint_id": 1, "files": files, "states": [], "extra": extra}
    try:
        manifest = PartitionManifest.from_json(json.dumps(doc).encode())
    except CorruptCheckpointError:
        return
    for f in manifest.files:
        assert is_name(f.name) and all(is_name(part) for part in f.path.split("/"))


@FUZZ
@given(json_values, st.booleans())
def test_any_metadata_without_the_clusters_hmac_is_refused(extra, signed_by_another):
    doc = {"checkpoint_id": 1, "partitions": 0, "manifests": [], "extra": extra}
    if signed_by_another:
        doc = sign(doc, checkpoint_key(b"another cluster"))
    try:
        CheckpointMetadata.from_json(json.dumps(doc).encode(), keys=(checkpoint_key(b"this cluster"),), accept_unsigned=False)
    except CorruptCheckpointError:
        return
    raise AssertionError("an unsigned or foreign _metadata was accepted")


@FUZZ
@given(st.binary(max_size=64))
def test_a_frame_header_announces_at_most_the_limit(header):
    from rockstate.rpc.frames import body_size

    try:
        size = body_size(header[:4], 4096)
    except RockstateError:
        return
    assert 0 <= size <= 4096 and struct.unpack(">I", header[:4])[0] == size


def test_msgpack_of_many_empty_maps_is_bounded_by_the_handshake_limit():
    """The finding: 8 MiB of empty maps took 600 MiB. Before the handshake a frame is at most 4 KiB (see
    test_preauth_limits); decoding 4 KiB of them stays small."""
    assert len(decode(msgpack.packb([{}] * 4000))) == 4000
