from __future__ import annotations

import shutil
import ssl
import subprocess
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


@pytest.fixture(scope="session")
def tls(tmp_path_factory):
    """(server context, client context) for 127.0.0.1, from a throwaway self-signed certificate."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", d / "key.pem", "-out", d / "cert.pem"], check=True, capture_output=True)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(d / "cert.pem", d / "key.pem")
    return server, ssl.create_default_context(cafile=d / "cert.pem")
