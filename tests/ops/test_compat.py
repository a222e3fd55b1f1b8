"""Compatibility: data directories, checkpoints and wire frames written by rockstate 0.1 (format 1, protocol 2) still work.

``tests/fixtures/compat-0.1`` was written once by ``make_fixture`` below and is
committed: a coordinator's and a node's data directories, a checkpoint and a
savepoint of a 4-partition cluster, and the bytes a 0.1 client sends. A later
change that cannot read them fails here: bump the format, say so in
docs/runbooks/upgrading.md, and either read the old format too or document the
migration. Regenerate only for a new fixture version (new folder), never over
this one: ``python -m tests.ops.test_compat <folder>``.
"""

import os
import shutil
import socket
import sys
import uuid

from rockstate import open as open_store
from rockstate.local.cluster import wait_until
from rockstate.rpc.frames import MAGIC, encode, read_frame_sync
from rockstate.rpc.messages import Hello, request
from rockstate.testing.cluster import local_cluster

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "compat-0.1")
P = 4
ORDERS = {("customer", i): {"order_id": str(uuid.UUID(int=i)), "placed": f"2026-11-{1 + i % 28:02d}T10:00:00Z",
                            "amount": f"{i * 3}.{i % 100:02d}", "items": [f"sku-{i % 7}"] * (1 + i % 3)} for i in range(60)}
LATE = {("customer", i): {"order_id": "after-the-checkpoint"} for i in range(5)}  # on disk, not in the checkpoint


def make_fixture(folder: str) -> None:
    root = os.path.abspath(folder)
    with local_cluster(nodes=1, partitions=P, processes=False, root=root, checkpoints=f"file://{root}/checkpoints") as cluster:
        with cluster.connect() as rs:
            rs.value_state("orders").put_many(ORDERS)
            rs.list_state("events").extend("stream-1", [f"event-{i}" for i in range(10)])
            rs.savepoint("release-0.1")
            rs.value_state("orders").put_many(LATE)
    for dirpath, _, files in os.walk(root):  # logs, locks and older OPTIONS files are not data, and grow the fixture
        options = sorted(n for n in files if n.startswith("OPTIONS-"))[:-1]
        for name in files:
            if name.startswith("LOG") or name in ("address.json", "rockstate.lock") or name in options:
                os.remove(os.path.join(dirpath, name))
    shutil.rmtree(os.path.join(root, "logs"), ignore_errors=True)
    frames = MAGIC + encode(request(0, Hello(version=2, name="compat-0.1"), None)) + encode(request(1, _get_table(), 5.0))
    with open(os.path.join(root, "client-frames.bin"), "wb") as f:
        f.write(frames)


def _get_table():
    from rockstate.cluster.protocol import GetTable

    return GetTable()


def copy_fixture(tmp_path) -> str:
    root = str(tmp_path / "compat")
    shutil.copytree(FIXTURE, root)
    return root


def test_a_0_1_cluster_restarts_on_its_data_directories(tmp_path):
    root = copy_fixture(tmp_path)
    with local_cluster(nodes=1, partitions=P, processes=False, root=root) as cluster, cluster.connect() as rs:
        expected = {**ORDERS, **LATE}
        assert rs.value_state("orders").get_many(list(expected)) == list(expected.values())
        assert rs.list_state("events").get("stream-1") == [f"event-{i}" for i in range(10)]
        assert [n["node_id"] for n in cluster.status()["nodes"]] == ["node-1"]  # its identity, from node.json


def test_a_0_1_node_store_opens_embedded(tmp_path):
    root = copy_fixture(tmp_path)
    with open_store(os.path.join(root, "node0", "store"), partitions=P) as store:
        assert store.value_state("orders").get(("customer", 7)) == ORDERS[("customer", 7)]


def test_a_0_1_checkpoint_and_savepoint_restore_into_a_new_cluster(tmp_path):
    root = copy_fixture(tmp_path)
    storage = f"file://{root}/checkpoints"
    with local_cluster(nodes=1, partitions=P, processes=False, root=str(tmp_path / "new"), checkpoints=storage) as cluster:
        with cluster.connect() as rs:  # a new cluster on a storage with checkpoints starts from the latest
            orders = rs.value_state("orders")
            wait_until(lambda: any(e["event"] == "cluster_restored" for e in cluster.status()["events"]), 30, "the restore at start")
            assert orders.get_many(list(ORDERS)) == list(ORDERS.values())
            orders.put(("customer", 1), {"order_id": "changed"})
            assert [s.name for s in rs.savepoints()] == ["release-0.1"]
            rs.restore(savepoint="release-0.1")
            assert orders.get(("customer", 1)) == ORDERS[("customer", 1)]


def test_a_0_1_client_is_understood(tmp_path):
    root = copy_fixture(tmp_path)
    with open(os.path.join(root, "client-frames.bin"), "rb") as f:
        frames = f.read()
    with local_cluster(nodes=1, partitions=P, processes=False, root=str(tmp_path / "wire")) as cluster:
        host, port = cluster.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock, sock.makefile("rb") as stream:
            sock.sendall(frames)
            assert stream.read(len(MAGIC)) == MAGIC
            replies = [read_frame_sync(stream), read_frame_sync(stream)]
    assert replies[0]["msg"]["op"] == "welcome" and replies[1]["id"] == 1
    assert len(replies[1]["ok"]["owners"]) == P and replies[1]["ok"]["limits"]["max_key_bytes"] > 0


if __name__ == "__main__":
    make_fixture(sys.argv[1])
