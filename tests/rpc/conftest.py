from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from rockstate.rpc import Channel, Server

from .support import HANDLERS, LoopThread


@pytest.fixture(scope="session")
def loop() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.close()


@pytest.fixture
def serve(loop: LoopThread) -> Iterator[Callable[..., Server]]:
    """Start servers on 127.0.0.1, port 0 by default, in the loop thread; stop them after the test."""
    servers: list[Server] = []

    def start(handlers: dict = HANDLERS, **kwargs) -> Server:
        kwargs.setdefault("name", f"server-{len(servers)}")
        server = Server(handlers, **kwargs)
        loop.run(server.start())
        servers.append(server)
        return server

    yield start
    for server in servers:
        loop.run(server.stop())


@pytest.fixture
def server(serve: Callable[..., Server]) -> Server:
    return serve()


@pytest.fixture
def channel(server: Server) -> Iterator[Channel]:
    with Channel(server.address, timeout=2, name="tester") as ch:
        yield ch
