"""A node cut off from the coordinator, but not from its clients (a TCP proxy on the node's link to the
coordinator, cut and healed): it stops serving on its own before its partitions are restored elsewhere."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from rockstate.cluster import protocol as p
from rockstate.local.cluster import wait_until
from rockstate.errors import PartitionUnavailableError
from rockstate.rpc.client import Channel
from rockstate.serde import decode_value, encode_key
from rockstate.testing.cluster import gen_cluster


class Link:
    """A TCP proxy to ``target`` on 127.0.0.1; ``cut()`` drops every connection and refuses new ones until ``heal()``."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.up = True
        self.sockets: set[socket.socket] = set()
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            if not self.up:
                client.close()
                continue
            server = socket.create_connection(self.target)
            with self.lock:
                self.sockets |= {client, server}
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                s.close()

    def cut(self) -> None:
        self.up = False
        with self.lock:
            for s in self.sockets:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self.sockets.clear()

    def heal(self) -> None:
        self.up = True

    def close(self) -> None:
        self.cut()
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept() (close alone does not)
        except OSError:
            pass
        self.listener.close()


@gen_cluster(nodes=2, partitions=6, checkpoints="file://{tmp_path}/chk", heartbeat_timeout=2.0, backup_count=0, processes=True)
def test_a_node_cut_off_from_the_coordinator_stops_serving_before_its_partitions_live_elsewhere(cluster):
    link = Link(cluster.address)
    try:
        cut_off = cluster.add_node(coordinator=link.address)
        with cluster.connect(retry_timeout=30) as rs, Channel(cut_off.address) as stale_client:
            s = rs.value_state("v")
            s.put_many({i: "checkpointed" for i in range(300)})
            rs.checkpoint()
            table = rs.backend.refresh()
            key = next(i for i in range(300) if table.owners[rs.partition_of(i)] == cut_off.node_id)
            pid = rs.partition_of(key)

            def stale_read():  # a client that keeps the table from before the cut, and asks the old owner
                return stale_client.call(p.Read(epoch=table.epoch, state="v", pids=[pid], counts=[1], keys=[encode_key(key)]))

            assert decode_value(stale_read()[0]) == "checkpointed"
            link.cut()

            def refused():
                try:
                    stale_read()
                except PartitionUnavailableError:
                    return time.time()
                return None

            stopped = wait_until(refused, 10, "the cut-off node to stop serving")
            restored = wait_until(lambda: [e for e in rs.backend.events() if e["event"] == "partition_restored"], 30, "the failover")
            dead = next(e for e in rs.backend.events() if e["event"] == "member_dead")
            assert dead["node"] == cut_off.node_id and stopped < dead["time"], "it stopped before it was declared dead"
            assert pid in {e["partition"] for e in restored}
            s.put(key, "new owner")
            with pytest.raises(PartitionUnavailableError):
                stale_read()  # the old copy is not served next to the new one

            link.heal()
            wait_until(lambda: [e for e in rs.backend.events() if e["event"] == "member_returned"], 30, "the node's return")
            cluster.wait_balanced()
            assert s.get(key) == "new owner", "the returning node's old copy did not come back"
            assert cut_off.node_id in rs.backend.refresh().owners, "it serves partitions again"
    finally:
        link.close()
