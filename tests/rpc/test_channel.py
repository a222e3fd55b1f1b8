import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from rockstate.errors import (
    ClusterTimeoutError,
    ConnectionLostError,
    NotOwnerError,
    ProtocolError,
    RockstateError,
    StoreClosedError,
    UnknownOperationError,
    UnknownStateError,
)
from rockstate.rpc import Channel, call_many

from .support import Big, Block, Crash, Echo, Fail, Sleep, Unserved, Whoami, Wrap, Wrapped, echo, fail, sleep, wait_for


def test_round_trip(channel):
    value = {"ints": [1, -2, 2**63], "bytes": b"\x00\xff", "text": "é", "none": None, "float": 0.5, "t": True}
    assert channel.call(Echo(value=value)) == value
    assert channel.call(Wrap(value=[1, 2])) == Wrapped(value=[1, 2], note="wrapped")


def test_handler_sees_the_callers_name_and_address(channel):
    who = channel.call(Whoami())
    assert who["peer"] == "tester"
    assert who["address"].startswith("127.0.0.1:")


@pytest.mark.parametrize("error", [NotOwnerError, UnknownStateError, ClusterTimeoutError, RockstateError])
def test_errors_arrive_as_the_same_type(channel, error):
    with pytest.raises(error) as info:
        channel.call(Fail(code=error.code))
    assert type(info.value) is error
    assert info.value.message == f"failed with {error.code}"
    assert info.value.data == {"code": error.code, "n": 7}
    assert channel.call(Echo(value=1)) == 1


def test_other_exceptions_become_rockstate_errors(channel):
    with pytest.raises(RockstateError, match="ValueError: boom") as info:
        channel.call(Crash())
    assert type(info.value) is RockstateError
    assert info.value.data["type"] == "ValueError"
    assert channel.call(Echo(value="still serving")) == "still serving"


def test_unknown_operation(channel):
    with pytest.raises(UnknownOperationError, match="no handler for 'test.unserved'"):
        channel.call(Unserved())
    assert channel.call(Echo(value=2)) == 2


def test_deadline_cancels_the_handler(channel):
    started = time.monotonic()
    with pytest.raises(ClusterTimeoutError, match="deadline of 0.2s") as info:
        channel.call(Sleep(seconds=30), timeout=0.2)
    assert time.monotonic() - started < 2
    assert info.value.data["deadline"] == 0.2  # the server's answer, not the client giving up
    assert channel.call(Echo(value=3)) == 3


def test_client_gives_up_on_a_server_that_cannot_answer(channel):
    with pytest.raises(ClusterTimeoutError, match="no reply from"):
        channel.call(Block(seconds=0.3), timeout=0.05)
    assert channel.call(Echo(value=4), timeout=2) == 4


def test_oversized_request_is_refused_locally(serve):
    server = serve(max_frame=1024)
    with Channel(server.address, max_frame=1024) as channel:
        with pytest.raises(ProtocolError, match="exceeds the limit"):
            channel.call(Echo(value=b"x" * 2048))
        assert channel.call(Echo(value=b"x")) == b"x"


def test_oversized_reply_becomes_an_error(serve):
    server = serve(max_frame=1024)
    with Channel(server.address) as channel:
        with pytest.raises(ProtocolError, match="exceeds the limit of 1024"):
            channel.call(Big(size=2000))
        assert channel.call(Echo(value=5)) == 5


def test_twenty_mib_payload(channel):
    payload = bytes(range(256)) * (20 * 4096)
    assert channel.call(Echo(value=payload), timeout=10) == payload


def test_threads_share_a_channel(channel):
    def work(t):
        return [channel.call(Echo(value=[t, i])) for i in range(500)]

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(work, range(8)))
    assert results == [[[t, i] for i in range(500)] for t in range(8)]
    assert len(channel._idle) <= 8


def test_call_many_to_three_servers(serve):
    servers = [serve({Whoami: _named(f"node-{i}"), Sleep: sleep, Echo: echo, Fail: fail}) for i in range(3)]
    channels = [Channel(s.address, timeout=2) for s in servers]
    assert call_many([(ch, Whoami()) for ch in channels]) == ["node-0", "node-1", "node-2"]

    started = time.monotonic()
    assert call_many([(ch, Sleep(seconds=0.3)) for ch in channels]) == ["slept"] * 3
    assert time.monotonic() - started < 0.8  # the three calls overlap (one after another: 0.9s)

    dead = Channel("127.0.0.1:1", timeout=1)
    results = call_many([(channels[0], Echo(value=1)), (channels[1], Fail(code="X")), (dead, Echo(value=2)),
                         (channels[2], Sleep(seconds=5))], timeout=0.3)
    assert results[0] == 1
    assert type(results[1]) is RockstateError and results[1].message == "failed with X"
    assert isinstance(results[2], ConnectionLostError)
    assert isinstance(results[3], ClusterTimeoutError)
    assert call_many([(ch, Echo(value=i)) for i, ch in enumerate(channels)]) == [0, 1, 2]
    for ch in channels:
        ch.close()


def _named(name):
    async def handler(msg, conn):
        return name
    return handler


def test_server_stop_and_restart(loop, serve):
    server = serve()
    channel = Channel(server.address, timeout=1)
    assert channel.call(Echo(value=1)) == 1
    loop.run(server.stop())
    with pytest.raises(ConnectionLostError):
        channel.call(Echo(value=2))
    again = serve(port=server.port)
    assert channel.call(Echo(value=3)) == 3

    loop.run(again.stop())  # closes the pooled connection under the channel's feet
    serve(port=server.port)
    wait_for(lambda: channel._idle[-1].stale())
    assert channel.call(Echo(value=4)) == 4  # the stale connection is replaced, not failed
    channel.close()


def test_closed_channel(server):
    channel = Channel(server.address)
    channel.call(Echo(value=1))
    channel.close()
    with pytest.raises(StoreClosedError):
        channel.call(Echo(value=1))


def test_nothing_listening():
    with pytest.raises(ConnectionLostError, match="127.0.0.1:1") as info:
        Channel("127.0.0.1:1").call(Echo(value=1))
    assert info.value.retryable


@pytest.mark.parametrize("size", [0, 65_535, 65_536, 300_000, 5_000_000])
def test_frames_of_any_size_round_trip(channel, size):
    """Replies up to one receive's size, and larger ones read straight into their own buffer."""
    assert channel.call(Echo(value=b"y" * size)) == b"y" * size
    assert channel.call(Big(size=size)) == b"x" * size
    assert channel.call(Echo(value="next")) == "next"  # nothing of a reply is left behind for the next one
