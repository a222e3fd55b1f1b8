"""The control plane's store on a real ZooKeeper: documents, version-checked writes, errors."""

from __future__ import annotations

import datetime as dt
import os
import uuid
from decimal import Decimal

import pytest
from kazoo.client import KazooClient

from rockstate.cluster.zkstore import ZooKeeperStore
from rockstate.errors import (InvalidNameError, SizeLimitError, StaleVersionError, ZooKeeperError,
                              ZooKeeperUnavailableError)


NODE = str(uuid.uuid4())


def table_document(epoch: int) -> dict:
    return {"epoch": epoch, "owners": {str(p): f"node-{p % 3 + 1}" for p in range(16)},
            "members": {NODE: {"address": "127.0.0.1:7411", "joined": dt.datetime(2026, 11, 23, 13, 5).isoformat()}},
            "checkpoint": {"id": 42, "bytes": str(Decimal("1048576.25"))}}


def test_documents_round_trip_under_the_clusters_root(zookeeper, open_store, cluster):
    store = open_store()
    assert store.read("table") is None
    first = store.write("table", table_document(1), version=None)
    second = store.write("membership", {"next_id": 4}, version=None)
    assert (first.version, second.version) == (0, 0)
    assert store.read("table") == first and store.names() == ["membership", "table"]

    # another session sees the same documents, at exactly /rockstate/<cluster>/docs
    other = open_store()
    assert other.read("table").data == table_document(1)
    raw = KazooClient(zookeeper.hosts)
    raw.start(timeout=5)
    try:
        assert sorted(raw.get_children(f"/rockstate/{cluster}/docs")) == ["membership", "table"]
    finally:
        raw.stop()
        raw.close()
    # and another cluster's root holds none of them
    with ZooKeeperStore(zookeeper.hosts, cluster + "-other", timeout=5) as other_cluster:
        assert other_cluster.names() == []


def test_a_write_names_the_version_it_read_and_a_stale_one_is_refused(open_store):
    leader, deposed = open_store(), open_store()
    store_doc = leader.write("table", table_document(1), version=None)
    stale = deposed.read("table")
    newer = leader.write("table", table_document(2), version=store_doc.version)
    assert newer.version == store_doc.version + 1

    with pytest.raises(StaleVersionError, match="changed since it was read"):
        deposed.write("table", table_document(99), version=stale.version)
    with pytest.raises(StaleVersionError, match="exists already"):
        deposed.write("table", table_document(99), version=None)
    assert leader.read("table") == newer  # the refused writes changed nothing


def test_bad_names_sizes_and_an_unreachable_server_are_typed_errors(zookeeper, open_store):
    store = open_store()
    for name in ("../table", "a/b", ""):
        with pytest.raises(InvalidNameError):
            store.write(name, {}, version=None)
    with pytest.raises(InvalidNameError):
        ZooKeeperStore(zookeeper.hosts, "no/slashes")
    with pytest.raises(SizeLimitError, match="split it"):  # random text: compression does not save it
        store.write("events", {"events": [os.urandom(500).hex() for _ in range(2500)]}, version=None)
    assert store.read("events") is None

    with socket_nobody_listens_on() as hosts:
        with pytest.raises(ZooKeeperUnavailableError, match="check that it runs") as info:
            ZooKeeperStore(hosts, "orders", timeout=0.5)
    assert info.value.retryable and isinstance(info.value, ZooKeeperError)


class socket_nobody_listens_on:
    def __enter__(self) -> str:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        return f"127.0.0.1:{self.sock.getsockname()[1]}"

    def __exit__(self, *exc) -> None:
        self.sock.close()


def test_a_large_clusters_table_is_kept_compressed_and_reads_back_whole(open_store):
    """P = 65,536 partitions: about 1.2 MB of JSON, over a znode's 1 MB, kept compressed."""
    store = open_store()
    nodes = {f"node-{n}": f"10.2.{n // 250}.{n % 250}:7701" for n in range(1, 41)}
    table = {"table": {"epoch": 912, "owners": [f"node-{1 + p % 40}" for p in range(65536)], "addresses": nodes,
                       "since": [p % 900 for p in range(65536)]}}
    store.write("table", table, version=None)
    assert store.read("table").data == table
    raw, _ = store.client.get(f"{store.root}/docs/table")
    assert raw[:1] == b"z" and len(raw) < 500_000
