import asyncio

import pytest

from rockstate.errors import (
    ClusterTimeoutError,
    ConnectionLostError,
    NotOwnerError,
    ProtocolVersionError,
    RockstateError,
    StoreClosedError,
    UnknownOperationError,
)
from rockstate.rpc.messages import PROTOCOL_VERSION
from rockstate.rpc import AsyncChannel, Server, client

from .support import HANDLERS, Crash, Echo, Fail, Sleep, Unserved, Whoami, Wrap, Wrapped, echo


def test_round_trip_errors_and_deadline(server, loop):
    async def main():
        async with AsyncChannel(server.address, timeout=2, name="peer") as ac:
            assert await ac.call(Echo(value={"k": [b"v", 1]})) == {"k": [b"v", 1]}
            assert await ac.call(Wrap(value=1)) == Wrapped(value=1, note="wrapped")
            assert (await ac.call(Whoami()))["peer"] == "peer"
            with pytest.raises(NotOwnerError, match="failed with NOT_OWNER") as info:
                await ac.call(Fail(code="NOT_OWNER"))
            assert info.value.data == {"code": "NOT_OWNER", "n": 7}
            with pytest.raises(RockstateError, match="ValueError: boom"):
                await ac.call(Crash())
            with pytest.raises(UnknownOperationError):
                await ac.call(Unserved())
            with pytest.raises(ClusterTimeoutError, match="deadline"):
                await ac.call(Sleep(seconds=30), timeout=0.1)
            assert await ac.call(Echo(value="alive")) == "alive"

    loop.run(main())


def test_many_calls_in_flight_on_one_connection(serve, loop):
    gate = asyncio.Event()

    async def wait_for_gate(msg, conn):
        await gate.wait()
        return "opened"

    server = serve({Sleep: wait_for_gate, Echo: echo})

    async def main():
        async with AsyncChannel(server.address, timeout=5) as ac:
            slow = asyncio.create_task(ac.call(Sleep(seconds=0)))
            results = await asyncio.gather(*(ac.call(Echo(value=i)) for i in range(500)))
            assert results == list(range(500))
            assert not slow.done()  # the echoes overtook it
            gate.set()
            assert await slow == "opened"

    loop.run(main())


def test_twenty_mib_payload(server, loop):
    payload = bytes(range(256)) * (20 * 4096)

    async def main():
        async with AsyncChannel(server.address, timeout=10) as ac:
            assert await ac.call(Echo(value=payload)) == payload

    loop.run(main())


def test_connection_loss_and_reconnect(loop):
    entered = asyncio.Event()

    async def hang(msg, conn):
        entered.set()
        await asyncio.sleep(msg.seconds)

    async def main():
        server = Server({Sleep: hang, Echo: echo}, name="first")
        await server.start()
        ac = AsyncChannel(server.address, timeout=5)
        assert await ac.call(Echo(value=1)) == 1
        in_flight = asyncio.create_task(ac.call(Sleep(seconds=30)))
        await asyncio.wait_for(entered.wait(), 5)
        await server.stop()
        with pytest.raises(ConnectionLostError):
            await in_flight
        with pytest.raises(ConnectionLostError):
            await ac.call(Echo(value=2))

        again = Server({Echo: echo}, port=server.port, name="again")
        await again.start()
        assert await ac.call(Echo(value=3)) == 3
        await ac.close()
        with pytest.raises(StoreClosedError):
            await ac.call(Echo(value=4))
        await again.stop()

    loop.run(main())


def test_protocol_version_mismatch(server, loop, monkeypatch):
    monkeypatch.setattr(client, "PROTOCOL_VERSION", 7)

    async def main():
        async with AsyncChannel(server.address) as ac:
            with pytest.raises(ProtocolVersionError, match=f"version 7.*version {PROTOCOL_VERSION}"):
                await ac.call(Echo(value=1))

    loop.run(main())


def test_own_event_loop():
    async def main():
        async with Server(HANDLERS, name="solo") as server, AsyncChannel(server.address) as ac:
            assert await ac.call(Echo(value="solo")) == "solo"

    asyncio.run(main())
