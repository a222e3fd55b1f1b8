"""What the server does with peers that misbehave: bad frames, other versions, wrong secrets."""

import asyncio
import socket
import struct

import pytest

from rockstate.errors import AuthenticationError, ProtocolError, ProtocolVersionError, RockstateError, UnknownOperationError
from rockstate.rpc.frames import MAGIC, write_frame_sync
from rockstate.rpc.messages import PROTOCOL_VERSION
from rockstate.rpc import AsyncChannel, Channel, client
from rockstate.rpc.messages import Welcome

from .support import Crash, Echo, RawConnection, Sleep, crash, echo, sleep, wait_for

BAD_FRAMES = {
    "undecodable": struct.pack(">I", 1) + b"\xc1",
    "not a request": struct.pack(">I", 1) + b"\x01",
    "oversized": struct.pack(">I", 2 << 20),
}


@pytest.mark.parametrize("after_hello", [False, True])
@pytest.mark.parametrize("kind", [*BAD_FRAMES, "truncated"])
def test_bad_frame_closes_only_its_connection(serve, kind, after_hello):
    server = serve(max_frame=1 << 20)
    bystander = Channel(server.address, timeout=2)
    assert bystander.call(Echo(value="before")) == "before"

    raw = RawConnection(server.address)
    if after_hello:
        assert isinstance(raw.hello()[1], Welcome)
    if kind == "truncated":
        raw.sock.sendall(struct.pack(">I", 100) + b"only ten b")
        raw.sock.shutdown(socket.SHUT_WR)  # the server sees the frame end early
    else:
        raw.sock.sendall(BAD_FRAMES[kind])
    rid, error = raw.reply()
    assert rid is None and isinstance(error, ProtocolError)
    assert raw.closed_by_peer()
    raw.close()

    assert bystander.call(Echo(value="after")) == "after"
    with Channel(server.address) as newcomer:
        assert newcomer.call(Echo(value="new")) == "new"
    bystander.close()


def test_bad_message_fails_only_its_request(server):
    raw = RawConnection(server.address)
    raw.hello()
    raw.send({"id": 1, "msg": {"op": "nope"}, "deadline": None})
    raw.send({"id": 2, "msg": {"op": Echo.op}, "deadline": None})
    raw.send({"id": 3, "msg": {"op": Echo.op, "value": "fine"}, "deadline": None})
    replies = dict(raw.reply() for _ in range(3))
    assert isinstance(replies[1], UnknownOperationError)
    assert isinstance(replies[2], ProtocolError) and "'value'" in replies[2].message
    assert replies[3] == "fine"
    raw.close()


def test_slow_request_does_not_hold_up_the_connection(server):
    raw = RawConnection(server.address)
    raw.hello()
    raw.send({"id": 1, "msg": Sleep(seconds=0.3).to_wire(), "deadline": None})
    raw.send({"id": 2, "msg": Echo(value="quick").to_wire(), "deadline": None})
    assert raw.reply() == (2, "quick")
    assert raw.reply() == (1, "slept")
    raw.close()


def test_protocol_version_mismatch(server, monkeypatch):
    raw = RawConnection(server.address)
    rid, error = raw.hello(version=99)
    assert rid is None and isinstance(error, ProtocolVersionError)
    assert raw.closed_by_peer()
    raw.close()

    monkeypatch.setattr(client, "PROTOCOL_VERSION", 98)
    with pytest.raises(ProtocolVersionError, match=f"version 98.*version {PROTOCOL_VERSION}") as info:
        Channel(server.address).call(Echo(value=1))
    assert info.value.data == {"client_version": 98, "server_version": PROTOCOL_VERSION}


def test_requests_before_hello_are_refused(server):
    raw = RawConnection(server.address)
    raw.send({"id": 1, "msg": Echo(value=1).to_wire(), "deadline": None})
    rid, error = raw.reply()
    assert rid is None and isinstance(error, ProtocolError) and "expected 'hello'" in error.message
    assert raw.closed_by_peer()
    raw.close()


class TestSecret:
    SECRET = "s3cret"

    @pytest.fixture
    def calls(self):
        return []

    @pytest.fixture
    def server(self, serve, calls):
        async def record(msg, conn):
            calls.append(msg.value)
            return msg.value
        return serve({Echo: record}, secret=self.SECRET)

    def test_right_secret(self, server, calls):
        with Channel(server.address, secret=self.SECRET) as channel:
            assert channel.call(Echo(value=1)) == 1
        with Channel(server.address, secret=self.SECRET.encode()) as channel:
            assert channel.call(Echo(value=2)) == 2
        assert calls == [1, 2]

    @pytest.mark.parametrize("secret", ["wrong", None])
    def test_wrong_or_missing_secret(self, server, calls, secret):
        with pytest.raises(AuthenticationError), Channel(server.address, secret=secret) as channel:
            channel.call(Echo(value=1))
        assert calls == []

    def test_skipping_the_proof(self, server, calls):
        raw = RawConnection(server.address)
        assert raw.hello()[1].op == "challenge"
        raw.send({"id": 1, "msg": Echo(value=1).to_wire(), "deadline": None})
        _, error = raw.reply()
        assert isinstance(error, AuthenticationError)
        assert raw.closed_by_peer()
        raw.close()
        assert calls == []

    def test_async_channel(self, server, loop, calls):
        async def main():
            async with AsyncChannel(server.address, secret=self.SECRET) as good:
                assert await good.call(Echo(value=1)) == 1
            async with AsyncChannel(server.address, secret="wrong") as bad:
                with pytest.raises(AuthenticationError):
                    await bad.call(Echo(value=2))
        loop.run(main())
        assert calls == [1]


def test_tls(serve, loop, tls):
    server_ctx, client_ctx = tls
    server = serve({Echo: echo, Sleep: sleep}, ssl=server_ctx)
    with Channel(server.address, ssl=client_ctx) as channel:
        for i in range(3):  # reuses the pooled TLS connection
            assert channel.call(Echo(value=b"x" * i)) == b"x" * i
        assert len(channel._idle) == 1

    async def main():
        async with AsyncChannel(server.address, ssl=client_ctx) as ac:
            assert await ac.call(Echo(value="tls")) == "tls"
    loop.run(main())


def test_inline_requests_are_answered_in_order_and_one_that_waits_holds_only_its_connection(serve, loop):
    released = asyncio.Event()

    async def held(msg, conn):
        await released.wait()
        return "released"

    server = serve({Echo: echo, Crash: crash, Sleep: held}, inline=(Echo, Crash, Sleep))
    raw = RawConnection(server.address)
    raw.hello()
    raw.send({"id": 1, "msg": Sleep(seconds=0).to_wire(), "deadline": None})
    raw.send({"id": 2, "msg": Echo(value="queued").to_wire(), "deadline": None})
    raw.send({"id": 3, "msg": Crash().to_wire(), "deadline": None})
    raw.send({"id": 4, "msg": Echo(value="last").to_wire(), "deadline": 5.0})
    with Channel(server.address, timeout=10) as other:
        assert other.call(Echo(value="other")) == "other"  # another connection is not held up
    wait_for(lambda: len(server._requests) == 1, timeout=10)  # request 1, waiting
    loop.run(_set(released))
    assert raw.reply() == (1, "released")  # a later request is answered only after it
    assert raw.reply() == (2, "queued")
    rid, error = raw.reply()
    assert rid == 3 and isinstance(error, RockstateError) and "ValueError: boom" in error.message
    assert raw.reply() == (4, "last")
    raw.close()


def test_stop_cancels_an_inline_request_that_waits(serve, loop):
    async def forever(msg, conn):
        await asyncio.Event().wait()

    server = serve({Echo: echo, Sleep: forever}, inline=(Echo, Sleep))
    raw = RawConnection(server.address)
    raw.hello()
    raw.send({"id": 1, "msg": Sleep(seconds=0).to_wire(), "deadline": None})
    wait_for(lambda: len(server._requests) == 1, timeout=10)
    loop.run(server.stop(), timeout=30)
    assert not server._requests
    assert raw.closed_by_peer()  # closed without an answer to the cancelled request
    raw.close()


def test_stop_refuses_a_connection_accepted_just_before(serve, loop):
    """A connection the kernel accepted, whose transport the loop builds only after ``stop()`` began, is closed
    unanswered: its requests would otherwise run on a stopped server (a task nobody cancels)."""
    async def forever(msg, conn):
        await asyncio.Event().wait()

    server = serve({Echo: echo, Sleep: forever})
    host, _, port = server.address.rpartition(":")

    async def stop_while_accepting() -> socket.socket:
        sock = socket.create_connection((host, int(port)), timeout=5)  # the kernel completes it; the loop has not run
        sock.sendall(MAGIC)
        write_frame_sync(sock, {"id": 0, "msg": {"op": "hello", "version": PROTOCOL_VERSION, "name": "raw"},
                                "deadline": None})
        write_frame_sync(sock, {"id": 1, "msg": Sleep(seconds=0).to_wire(), "deadline": None})
        for _ in range(1000):  # until the loop built its transport (the accept waits), connection_made still to come
            if any(getattr(coro := t.get_coro(), "__name__", "") == "_accept_connection2" and coro.cr_await is not None
                   for t in asyncio.all_tasks()):
                break
            await asyncio.sleep(0)
        else:
            raise AssertionError("the loop never accepted the connection")
        await server.stop()
        return sock

    sock = loop.run(stop_while_accepting())
    sock.settimeout(5)
    try:
        assert sock.recv(1 << 16) == b""  # closed with nothing sent: no greeting, no Welcome
    except ConnectionResetError:
        pass  # aborted: as closed
    finally:
        sock.close()
    leftover = loop.run(_handlers_running())
    assert leftover == [], f"requests still running on the stopped server: {leftover}"


async def _handlers_running() -> list[str]:
    await asyncio.sleep(0.2)  # what a connection made after stop() would have started by now
    return [repr(t) for t in asyncio.all_tasks() if "Server._handle" in repr(t.get_coro())]


async def _set(event: asyncio.Event) -> None:
    event.set()
