"""ZooKeeper ACLs: coordinators authenticate (digest, from the node secret) and create every znode writable by them
only; an unauthenticated client reads but cannot delete the election znode nor rewrite the table. Real ZooKeeper."""

from __future__ import annotations

import uuid

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE

from rockstate.cluster.zkstore import ZooKeeperStore, coordinator_auth
from rockstate.local.cluster import wait_until
from rockstate.local.zookeeper import ZooKeeperServer


@pytest.fixture(scope="module")
def zookeeper(tmp_path_factory):
    with ZooKeeperServer(str(tmp_path_factory.mktemp("zookeeper"))) as server:
        yield server


def test_an_unauthenticated_client_cannot_delete_the_election_znode_nor_rewrite_the_table(zookeeper):
    cluster = f"orders-{uuid.uuid4().hex[:8]}"
    auth = coordinator_auth(b"the node secret")
    store = ZooKeeperStore(zookeeper.hosts, cluster, timeout=5.0, session_timeout=4.0, auth=auth)
    leadership = store.leadership("127.0.0.1:7700").start()
    store.write("table", {"epoch": 1, "owners": ["node-1"]}, None)
    anonymous = KazooClient(zookeeper.hosts)
    anonymous.start(timeout=5)
    try:
        wait_until(lambda: leadership.leading, 10, "the coordinator leads")
        election = leadership.node
        table = f"{store.root}/docs/table"
        assert anonymous.get(table)[0]  # followers read
        with pytest.raises(NoAuthError):
            anonymous.delete(election)
        with pytest.raises(NoAuthError):
            anonymous.set(table, b'{"epoch":99,"owners":["evil"]}')
        with pytest.raises(NoAuthError):
            anonymous.delete(table)
        with pytest.raises(NoAuthError):
            anonymous.create(f"{store.root}/docs/membership", b"{}")
        with pytest.raises(NoAuthError):
            anonymous.set_acls(store.root, [OPEN_ACL_UNSAFE[0]])
        assert anonymous.exists(election) is not None and leadership.leading  # unaffected
        assert store.read("table").data == {"epoch": 1, "owners": ["node-1"]}
        follower = ZooKeeperStore(zookeeper.hosts, cluster, timeout=5.0, auth=None)  # nodes and clients follow without auth
        assert follower.contenders() == ["127.0.0.1:7700"]
        follower.close()
        wrong = KazooClient(zookeeper.hosts, auth_data=[("digest", coordinator_auth(b"another secret"))])
        wrong.start(timeout=5)
        with pytest.raises(NoAuthError):
            wrong.set(table, b"{}")
        wrong.stop()
        wrong.close()
    finally:
        anonymous.stop()
        anonymous.close()
        store.close()


def test_znodes_made_before_acls_are_locked_down_by_the_first_authenticated_coordinator(zookeeper):
    cluster = f"orders-{uuid.uuid4().hex[:8]}"
    old = ZooKeeperStore(zookeeper.hosts, cluster, timeout=5.0, auth=None)  # an older coordinator: open ACLs
    old.write("table", {"epoch": 1}, None)
    old.close()
    ZooKeeperStore(zookeeper.hosts, cluster, timeout=5.0, auth=coordinator_auth(b"s")).close()
    anonymous = KazooClient(zookeeper.hosts)
    anonymous.start(timeout=5)
    try:
        with pytest.raises(NoAuthError):
            anonymous.set(f"/rockstate/{cluster}/docs/table", b"{}")
    finally:
        anonymous.stop()
        anonymous.close()
