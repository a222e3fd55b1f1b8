"""A real ZooKeeper (Debian's package) started once for these tests, stopped by its PID at the end.

Each test works under a cluster name of its own, so tests share the server
but not their documents or elections.
"""

from __future__ import annotations

import uuid

import pytest

from rockstate.cluster.zkstore import ZooKeeperStore
from rockstate.local.zookeeper import ZooKeeperServer


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory):
    with ZooKeeperServer(str(tmp_path_factory.mktemp("zookeeper"))) as server:
        yield server


@pytest.fixture
def cluster():
    return f"orders-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def open_store(zookeeper, cluster):
    """Opens stores (one ZooKeeper session each) on the shared server; closes them after the test."""
    stores = []

    def open_(hosts: str | None = None, **options) -> ZooKeeperStore:
        store = ZooKeeperStore(hosts or zookeeper.hosts, cluster, **{"timeout": 5.0, "session_timeout": 2.0, **options})
        stores.append(store)
        return store

    yield open_
    for store in stores:
        store.close()
