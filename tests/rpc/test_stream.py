"""A handler's ``Stream`` answer (a copy's files): its result, then raw bytes on a connection of its own.

Real servers and sockets; the chunks are made up here (a node's are its copies' files, ``cluster/moves.py``).
"""

import asyncio
import io
import threading

import pytest

from rockstate.cluster.transfer import receive_files
from rockstate.errors import ClusterError, ClusterTimeoutError, ConnectionLostError, NotOwnerError
from rockstate.rpc import AsyncChannel
from rockstate.rpc.messages import Message
from rockstate.rpc import Stream

from .support import Echo, echo, wait_for


class Files(Message):
    """Answer the sizes, then that many bytes for each (``stall_after``: then wait forever; ``fail_after``: then raise)."""

    op = "test.files"
    sizes: list
    stall_after: int = -1
    fail_after: int = -1


def content(i: int, size: int) -> bytes:
    return bytes((i + j) % 251 for j in range(251)) * (size // 251) + bytes(size % 251)


class Source:
    """The ``Files`` handler, and what became of each stream's chunks."""

    def __init__(self) -> None:
        self.closed = threading.Event()  # a stream's generator was closed (its files would be)

    async def files(self, msg: Files, conn) -> Stream:
        if any(size < 0 for size in msg.sizes):
            raise NotOwnerError("no such copy here")  # an error before the stream: an ordinary error reply

        async def chunks():
            sent = 0
            try:
                for i, size in enumerate(msg.sizes):
                    data = content(i, size)
                    for at in range(0, size, 1 << 20):
                        piece = data[at:at + (1 << 20)]
                        if sent + len(piece) > msg.fail_after >= 0:
                            raise OSError("the disk went away")
                        if sent + len(piece) > msg.stall_after >= 0:
                            await asyncio.Event().wait()
                        sent += len(piece)
                        yield piece
            finally:
                self.closed.set()

        return Stream({"sizes": msg.sizes}, chunks())


def read_all(answer: dict, read_into) -> tuple[dict, bytes]:
    got, buffer = bytearray(), memoryview(bytearray(1 << 16))
    while n := read_into(buffer):
        got += buffer[:n]
    return answer, bytes(got)


@pytest.mark.parametrize("security", ["plain", "tls", "secret"])
def test_a_stream_brings_its_answer_then_its_bytes_and_the_server_serves_on(serve, loop, tls, security):
    server_ctx, client_ctx = tls
    secret = "the cluster secret" if security == "secret" else None
    source = Source()
    server = serve({Files: source.files, Echo: echo}, ssl=server_ctx if security == "tls" else None, secret=secret)
    sizes = [0, 1, (5 << 20) + 3, 17 << 20]

    async def main():
        async with AsyncChannel(server.address, timeout=10, ssl=client_ctx if security == "tls" else None, secret=secret) as ac:
            assert await ac.call(Echo(value="before")) == "before"
            answer, got = await ac.stream(Files(sizes=sizes), read_all)
            assert answer == {"sizes": sizes}
            assert got == b"".join(content(i, size) for i, size in enumerate(sizes))  # nothing more: then it closed
            assert await ac.call(Echo(value="after")) == "after"  # the channel's own connection is untouched

    loop.run(main(), timeout=60)
    assert source.closed.is_set()
    wait_for(lambda: not server._requests and not server._connections)  # the stream ended; both connections closed


def test_receive_files_writes_each_file_and_refuses_a_short_stream_or_a_bad_name(tmp_path):
    files = [["000009.sst", 300_000], ["CURRENT", 16], ["MANIFEST-000005", 0]]
    data = b"".join(content(i, size) for i, (_, size) in enumerate(files))
    assert receive_files(files, str(tmp_path / "copy"), io.BytesIO(data).readinto) == 300_016
    for i, (name, size) in enumerate(files):
        assert (tmp_path / "copy" / name).read_bytes() == content(i, size)
    with pytest.raises(ClusterError, match=r"the copy's stream ended 299990 bytes into 000009.sst \(300000 bytes\)"):
        receive_files(files, str(tmp_path / "short"), io.BytesIO(data[:299_990]).readinto)
    for bad in ("../escape", ".hidden", "a/b"):
        with pytest.raises(ClusterError, match="bad file"):
            receive_files([[bad, 1]], str(tmp_path / "bad"), io.BytesIO(b"x").readinto)
    assert not (tmp_path / "escape").exists()


def test_an_error_before_the_stream_is_raised_as_itself(serve, loop):
    server = serve({Files: Source().files})

    async def main():
        async with AsyncChannel(server.address, timeout=5) as ac:
            with pytest.raises(NotOwnerError, match="no such copy here"):
                await ac.stream(Files(sizes=[-1]), read_all)

    loop.run(main())
    wait_for(lambda: not server._connections)


def test_a_stream_whose_source_fails_midway_ends_short(serve, loop, tmp_path):
    source = Source()
    server = serve({Files: source.files})

    async def main():
        async with AsyncChannel(server.address, timeout=5) as ac:
            _, got = await ac.stream(Files(sizes=[8 << 20], fail_after=3 << 20), read_all)
            assert got == content(0, 8 << 20)[:3 << 20]  # what was sent before the failure, then the end
            with pytest.raises(ClusterError, match="stream ended 3145728 bytes into f"):
                await ac.stream(Files(sizes=[8 << 20], fail_after=3 << 20),
                                lambda answer, read_into: receive_files([["f", 8 << 20]], str(tmp_path), read_into))

    loop.run(main())
    assert source.closed.is_set()
    wait_for(lambda: not server._requests and not server._connections)


def test_a_reader_that_stops_reading_frees_the_source(serve, loop):
    source = Source()
    server = serve({Files: source.files})

    def first_read_then_fail(answer, read_into):
        assert read_into(memoryview(bytearray(1024))) > 0
        raise RuntimeError("the target's disk is full")

    async def main():
        async with AsyncChannel(server.address, timeout=5) as ac:
            with pytest.raises(RuntimeError, match="disk is full"):
                await ac.stream(Files(sizes=[64 << 20]), first_read_then_fail)

    loop.run(main())
    assert source.closed.wait(10)  # the server's writes stopped when the connection closed, not at 64 MiB
    wait_for(lambda: not server._requests and not server._connections)


def test_a_stalled_stream_times_out_and_a_cancelled_one_lets_go(serve, loop):
    source = Source()
    server = serve({Files: source.files})
    stuck = threading.Event()

    def read_until_stuck(answer, read_into):
        buffer, got = memoryview(bytearray(1 << 16)), 0
        while got < (1 << 20):
            got += read_into(buffer)
        stuck.set()
        while read_into(buffer):
            pass

    async def main():
        async with AsyncChannel(server.address, timeout=5) as ac:
            with pytest.raises(ClusterTimeoutError, match="no reply"):
                await ac.stream(Files(sizes=[4 << 20], stall_after=1 << 20), read_all, read_timeout=0.3)
            stuck.clear()
            task = asyncio.ensure_future(ac.stream(Files(sizes=[4 << 20], stall_after=1 << 20), read_until_stuck,
                                                   read_timeout=60))
            while not stuck.is_set():
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    loop.run(main(), timeout=30)
    wait_for(lambda: not server._connections, timeout=10)  # the reading thread let go of it too


def test_a_stream_from_a_server_that_went_away_is_a_lost_connection(serve, loop):
    server = serve({Files: Source().files})
    address = server.address
    loop.run(server.stop())

    async def main():
        async with AsyncChannel(address, timeout=2) as ac:
            with pytest.raises(ConnectionLostError):
                await ac.stream(Files(sizes=[1]), read_all)

    loop.run(main())
