"""The store and the election through a restart of the ZooKeeper server on the same data directory."""

from __future__ import annotations

from rockstate.local.cluster import wait_until
from rockstate.cluster.zkstore import ZooKeeperStore
from rockstate.errors import ZooKeeperUnavailableError
from rockstate.retry import Retry
from rockstate.local.zookeeper import ZooKeeperServer

UNTIL_ZOOKEEPER_ANSWERS = Retry(deadline=20.0, initial=0.05, maximum=0.5)


def test_documents_and_the_leader_survive_a_zookeeper_restart(tmp_path):
    with ZooKeeperServer(str(tmp_path / "zookeeper")) as server:
        store = ZooKeeperStore(server.hosts, "payments", timeout=1.0, session_timeout=10.0)
        leadership = store.leadership("coordinator-a").start()
        try:
            wait_until(lambda: leadership.leading, 5, "the only contender to lead")
            written = store.write("table", {"epoch": 7, "owners": {"0": "node-1"}}, version=None, fence=leadership)

            server.stop(kill=True)  # a crash: only what ZooKeeper synced to its log is left
            try:
                store.read("table")
                assert False, "a read with the server down answered"
            except ZooKeeperUnavailableError as e:
                assert e.retryable and "check that it runs" in e.message
            server.start()

            # the client reconnects within its session timeout: same session, so the same leader
            assert UNTIL_ZOOKEEPER_ANSWERS.call(store.read, "table") == written
            assert leadership.leading and leadership.leader() == "coordinator-a"
            newer = UNTIL_ZOOKEEPER_ANSWERS.call(store.write, "table", {"epoch": 8}, written.version, leadership)
            assert newer.version == written.version + 1

            with ZooKeeperStore(server.hosts, "payments", timeout=5.0) as other:  # a new session reads it too
                assert other.read("table") == newer
        finally:
            leadership.stop()
            store.close()
