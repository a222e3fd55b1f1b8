import asyncio
import socket
import struct

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rockstate.errors import ConnectionLostError, FrameTruncatedError, ProtocolError
from rockstate.rpc.frames import HEADER_SIZE, decode, encode, packer, read_frame, read_frame_sync, write_frame_sync

ints = st.integers(-(2**63), 2**64 - 1)  # msgpack's range
native = st.recursive(
    st.none() | st.booleans() | ints | st.floats(allow_nan=False) | st.text() | st.binary(),
    lambda inner: st.lists(inner) | st.dictionaries(st.text() | ints, inner),
    max_leaves=20,
)


@given(native)
def test_encode_decode_round_trip(obj):
    frame = encode(obj)
    assert struct.unpack(">I", frame[:4])[0] == len(frame) - 4
    assert decode(frame[4:]) == obj


def test_encode_refuses_oversized_and_unencodable():
    with pytest.raises(ProtocolError, match="exceeds the limit of 10 bytes"):
        encode(b"x" * 100, max_frame=10)
    with pytest.raises(ProtocolError, match="cannot encode"):
        encode({1, 2})


def test_decode_refuses_garbage():
    with pytest.raises(ProtocolError, match="undecodable frame"):
        decode(b"\xc1")
    with pytest.raises(ProtocolError, match="undecodable frame"):
        decode(msgpack.packb(1) + b"extra")


def _pair():
    a, b = socket.socketpair()
    return a, b, b.makefile("rb")


def test_sync_frames_over_a_socket():
    a, b, stream = _pair()
    with a, b, stream:
        write_frame_sync(a, {"k": b"v"})
        write_frame_sync(a, [1, 2])
        assert read_frame_sync(stream) == {"k": b"v"}
        assert read_frame_sync(stream) == [1, 2]
        a.close()
        with pytest.raises(ConnectionLostError):  # a clean close between frames
            read_frame_sync(stream)


@pytest.mark.parametrize("sent", [b"\x00\x00", struct.pack(">I", 100) + b"short"])
def test_sync_truncated_frame(sent):
    a, b, stream = _pair()
    with a, b, stream:
        a.sendall(sent)
        a.close()
        with pytest.raises(FrameTruncatedError, match="truncated") as info:
            read_frame_sync(stream)
        assert isinstance(info.value, ConnectionLostError) and info.value.retryable


def test_sync_oversized_frame_is_refused_before_its_body():
    a, b, stream = _pair()
    with a, b, stream:
        a.sendall(struct.pack(">I", 1 << 30))
        with pytest.raises(ProtocolError, match="exceeds the limit"):
            read_frame_sync(stream, max_frame=1 << 20)


def test_async_frames():
    async def main():
        reader = asyncio.StreamReader()
        reader.feed_data(encode({"a": 1}) + struct.pack(">I", 50) + b"cut")
        reader.feed_eof()
        assert await read_frame(reader) == {"a": 1}
        with pytest.raises(FrameTruncatedError, match="after 3 of 50 bytes"):
            await read_frame(reader)

        reader = asyncio.StreamReader()
        reader.feed_eof()
        with pytest.raises(ConnectionLostError):
            await read_frame(reader)

        reader = asyncio.StreamReader()
        reader.feed_data(struct.pack(">I", 2048))
        with pytest.raises(ProtocolError, match="exceeds the limit of 1024"):
            await read_frame(reader, max_frame=1024)

    asyncio.run(main())


def test_a_reused_packer_encodes_like_packb_even_after_a_failure():
    """A connection's own encoder (frames.packer) gives the frames msgpack.packb gives; a frame that fails to
    encode leaves nothing behind for the next one."""
    pack = packer()
    frame = {"id": 7, "msg": {"op": "read", "groups": [[3, [b"\x00" * 40, "k\u00e9y"]]], "deadline": 2.5}}
    assert encode(frame, pack=pack) == encode(frame)
    with pytest.raises(ProtocolError, match="cannot encode"):
        encode({"id": 8, "ok": {1, 2}}, pack=pack)
    assert encode({"id": 9, "ok": None}, pack=pack) == encode({"id": 9, "ok": None})
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        encode({"ok": b"x" * 100}, max_frame=50, pack=pack)
    assert decode(encode(frame, pack=pack)[HEADER_SIZE:]) == frame
