"""A write or compare-and-set whose reply is lost is retried by the client and applied once: on the node
that applied it, after its partition moved, and after a failover, on multi-process clusters."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

import pytest

from rockstate.cluster import protocol as p
from rockstate.rpc.frames import MAGIC, decode
from rockstate.rpc.messages import parse_reply
from rockstate.local.cluster import wait_until
from rockstate.errors import ProtocolError
from rockstate.rpc.client import Channel
from rockstate.serde import encode_key, encode_value
from rockstate.store import APPEND, requests
from rockstate.testing.workload import keys_for
from rockstate.testing.cluster import gen_cluster, local_cluster

_HEADER = struct.Struct(">I")  # rpc/frames.py: a frame is a 4-byte big-endian body length, then the body


class ReplyDropper:
    """A TCP proxy to a node that, while ``drops`` > 0, forwards a request and then swallows its reply (a result; an
    error is passed on, its request was not applied):
    it calls ``on_drop()`` and closes the connection, as a network failure after the node applied it would.
    The first reply on a connection (the handshake's) always passes."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.drops = self.dropped = 0
        self.on_drop = lambda: None
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            server = socket.create_connection(self.target)
            threading.Thread(target=self._requests, args=(client, server), daemon=True).start()
            threading.Thread(target=self._replies, args=(server, client), daemon=True).start()

    @staticmethod
    def _requests(client: socket.socket, server: socket.socket) -> None:
        try:
            while data := client.recv(65536):
                server.sendall(data)
        except OSError:
            pass
        finally:
            server.close()

    def _replies(self, server: socket.socket, client: socket.socket) -> None:
        stream = server.makefile("rb")
        try:
            client.sendall(stream.read(len(MAGIC)))  # the server's greeting comes before any frame
            handshake = True
            while len(header := stream.read(_HEADER.size)) == _HEADER.size:
                frame = header + stream.read(_HEADER.unpack(header)[0])
                with self.lock:  # an error answers a request the node did not apply (e.g. a lease lapsed under load)
                    drop = not handshake and self.drops > 0 and not isinstance(parse_reply(decode(frame[_HEADER.size:]))[1], Exception)
                    if drop:
                        self.drops, self.dropped = self.drops - 1, self.dropped + 1
                if drop:
                    self.on_drop()
                    break
                handshake = False
                client.sendall(frame)
        except OSError:
            pass
        finally:
            for s in (client, server):  # shutdown, not just close: it wakes the other direction's recv
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept() (close alone does not)
        self.listener.close()


@pytest.fixture
def one_node(tmp_path):
    with local_cluster(processes=True, nodes=1, partitions=4, root=str(tmp_path)) as cluster:
        proxy = ReplyDropper(cluster.nodes()[0].address)
        yield cluster, proxy
        proxy.close()


def through(proxy: ReplyDropper, rs) -> None:
    """Send the client's node requests through the proxy (the node advertises its own address)."""
    backend = rs.backend
    backend._channels[proxy.address] = channel = backend._new_channel(proxy.address)
    backend._channels[f"{proxy.target[0]}:{proxy.target[1]}"] = channel


def append_at(rs, keys, item) -> None:
    """One write request that appends ``item`` to the list of every key (in several partitions)."""
    rs.list_state("log", create=True)  # the raw write below needs it defined
    rs.backend.write({rs.partition_of(k): [(APPEND, "log", encode_key(k), encode_value(item))] for k in keys})


def test_appends_whose_replies_are_lost_are_applied_once(one_node):
    cluster, proxy = one_node
    with cluster.connect(retry_timeout=30) as rs:
        through(proxy, rs)
        log = rs.list_state("log")
        proxy.drops = 3
        for i in range(3):
            log.append("k", i)
        assert proxy.dropped == 3
        keys = keys_for(rs)
        proxy.drops = 1
        append_at(rs, keys, "x")  # one request to several partitions
        append_at(rs, keys, "y")
        assert proxy.dropped == 4
        assert log.get("k") == [0, 1, 2]
        assert [log.get(k) for k in keys] == [["x", "y"]] * len(keys)


def test_a_put_retried_after_a_lost_reply_does_not_overwrite_a_later_write(one_node):
    cluster, proxy = one_node
    with cluster.connect(retry_timeout=30) as rs, cluster.connect() as other:
        through(proxy, rs)
        proxy.on_drop = lambda: other.value_state("register").put("k", "later")  # lands between attempt and retry
        proxy.drops = 1
        rs.value_state("register").put("k", "first")
        assert proxy.dropped == 1
        assert rs.value_state("register").get("k") == "later"


def test_a_compare_and_set_retried_after_a_lost_reply_answers_with_what_it_did(one_node):
    cluster, proxy = one_node
    with cluster.connect(retry_timeout=30) as rs, cluster.connect() as other:
        through(proxy, rs)
        proxy.on_drop = lambda: other.value_state("register").put("c", "later")
        proxy.drops = 1
        assert rs.value_state("register").compare_and_set("c", None, "mine") is True  # it did set it
        assert proxy.dropped == 1
        assert rs.value_state("register").get("c") == "later"


def test_a_malformed_request_id_is_refused_and_the_node_keeps_serving(one_node):
    cluster, _ = one_node
    with cluster.connect() as rs, Channel(cluster.nodes()[0].address) as channel:
        rs.value_state("v").put("kept", 1)
        epoch = rs.backend.refresh().epoch
        with pytest.raises(ProtocolError, match=r"'request' of 'write' message must be None or 16 bytes"):
            channel.call(p.Write(epoch=epoch, groups=[], request=b"short"))
        assert rs.value_state("v").get("kept") == 1


@gen_cluster(nodes=1, partitions=8, processes=True)
def test_a_retry_after_a_move_is_not_applied_again(cluster, monkeypatch):
    """The ids move with the partition: a request applied at the old owner and retried at the new one."""
    with cluster.connect() as rs:
        log, keys = rs.list_state("log"), keys_for(rs)
        monkeypatch.setattr(requests, "new_id", lambda: b"the same request")  # every write: one retried request
        for k in keys:
            log.append(k, "once")
        before = rs.backend.refresh()
        cluster.add_node()
        cluster.wait_balanced()
        after = rs.backend.refresh()
        assert any(before.owners[pid] != after.owners[pid] for pid in range(rs.partitions))
        for k in keys:
            log.append(k, "once")
        assert [log.get(k) for k in keys] == [["once"]] * len(keys)


def test_a_retry_after_a_failover_applies_what_the_checkpoint_lost_once(tmp_path, monkeypatch):
    """The ids are in the checkpoint: a request from before it is not applied again by its retry; one from
    after it was lost with the dead node's writes, and its retry applies it once."""
    url = (tmp_path / "checkpoints").as_uri()
    with local_cluster(processes=True, nodes=2, partitions=6, root=str(tmp_path / "c"), checkpoints=url, heartbeat_timeout=1.0, backup_count=0) as cluster:
        with cluster.connect(retry_timeout=30) as rs:
            log, keys = rs.list_state("log"), keys_for(rs)
            ids = iter([b"before the check", b"after the checkp"] * 2)
            monkeypatch.setattr(requests, "new_id", lambda: next(ids))
            append_at(rs, keys, "before")
            chk = rs.checkpoint().id
            append_at(rs, keys, "after")
            victim = cluster.nodes()[0]
            owned = set(rs.backend.refresh().owned_by(victim.node_id))
            cluster.kill_node(victim.node_id)
            restored = wait_until(
                lambda: [e for e in cluster.status()["events"] if e["event"] == "partition_restored"], 30, "failover")
            assert owned and {e["partition"] for e in restored} == owned and {e["checkpoint"] for e in restored} == {chk}
            assert [log.get(k) for k in keys if rs.partition_of(k) in owned] == [["before"]] * len(owned)  # the loss
            append_at(rs, keys, "before")  # both retried: each applied once in all
            append_at(rs, keys, "after")
            assert [log.get(k) for k in keys] == [["before", "after"]] * len(keys)
