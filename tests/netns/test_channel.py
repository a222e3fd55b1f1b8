"""The server-to-server channel across a cut link: after the heal it serves again at once, instead of waiting
out TCP's backed-off retransmissions on the connection the cut stalled (seconds to minutes): the kernel drops a
connection whose data went unacknowledged for ``UNACKNOWLEDGED_MS``, and the next call reconnects."""

from __future__ import annotations

import asyncio
import threading
import time

from typing import Any

import pytest

from rockstate.errors import RockstateError
from rockstate.rpc.async_client import UNACKNOWLEDGED_MS, AsyncChannel
from rockstate.rpc.server import Server
from rockstate.testing import netns
from rockstate.rpc.messages import Message


class Echo(Message):
    op = "test.netns.echo"  # its own: tests/rpc registers "test.echo", and a message's op is taken once per process
    value: Any


class LoopOn(threading.Thread):
    """An event loop in a thread of its own inside host ``name``."""

    def __init__(self, net: netns.Network, name: str) -> None:
        super().__init__(daemon=True)
        self.net, self.host, self.loop, self.ready = net, name, asyncio.new_event_loop(), threading.Event()
        self.start()
        self.ready.wait(10)

    def run(self) -> None:
        self.net.enter(self.host)
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self.ready.set)
        self.loop.run_forever()

    def __call__(self, coroutine, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.join(10)


@pytest.mark.timeout(60)
def test_a_channel_serves_at_once_after_a_cut_heals(network):
    server_host = network.add("server")
    network.add("client")
    on_server, on_client = LoopOn(network, "server"), LoopOn(network, "client")

    async def echo(msg, conn):
        return msg.value

    server = Server({Echo: echo}, host=server_host.address, name="server")
    on_server(server.start())
    channel = AsyncChannel(server.address, name="client")
    try:
        assert on_client(channel.call(Echo(value="before"), timeout=5.0)) == "before"
        network.cut("server", "client")  # in the server's namespace: the client's packets are lost on the way
        cut = time.monotonic()
        while time.monotonic() - cut < UNACKNOWLEDGED_MS / 1000 + 2:  # requests stuck unacknowledged: TCP backs off resending
            with pytest.raises(RockstateError):
                on_client(channel.call(Echo(value="lost"), timeout=0.5))
            time.sleep(0.2)
        network.heal("server", "client")
        started = time.monotonic()
        assert on_client(channel.call(Echo(value="after"), timeout=2.0)) == "after"
        assert time.monotonic() - started < 2.0
    finally:
        on_client(channel.close())
        on_server(server.stop())
        on_client.stop()
        on_server.stop()
