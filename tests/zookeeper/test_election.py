"""Leader election on a real ZooKeeper: one leader, standbys that take over when its session ends, fenced writes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from kazoo.client import KazooClient

from rockstate.local.cluster import wait_until
from rockstate.errors import NotLeaderError


def expire_session(hosts: str, client: KazooClient) -> None:
    """Expire ``client``'s session for real: a second connection takes it over and closes it (what
    ZooKeeper does to a client cut off for longer than its session timeout)."""
    thief = KazooClient(hosts, client_id=client.client_id)
    thief.start(timeout=5)
    thief.stop()
    thief.close()


@pytest.fixture
def contenders(open_store):
    """Start contenders (each on its own store, so its own session); stop them after the test."""
    started = []

    def start(*identifiers: str):
        events = {i: [] for i in identifiers}
        for identifier in identifiers:
            store = open_store()
            leadership = store.leadership(identifier, on_elected=lambda i=identifier: events[i].append("elected"),
                                          on_deposed=lambda i=identifier: events[i].append("deposed"))
            started.append(leadership.start())
            wait_until(lambda: identifier in leadership.contenders(), 5, f"{identifier} to contend")
        return started[-len(identifiers):], events

    yield start
    for leadership in started:
        leadership.stop()


def test_two_contenders_elect_one_leader_and_the_standby_takes_over_when_the_leaders_session_closes(contenders):
    (a, b), events = contenders("10.0.0.1:7400", "10.0.0.2:7400")
    wait_until(lambda: a.leading, 5, "the first contender to lead")
    assert not b.leading and events == {"10.0.0.1:7400": ["elected"], "10.0.0.2:7400": []}
    assert (a.leader(), a.standbys()) == (b.leader(), b.standbys()) == ("10.0.0.1:7400", ["10.0.0.2:7400"])

    a.store.close()  # the leader's process ends: its session closes and its znode goes with it
    wait_until(lambda: b.leading, 3, "the standby to take over")
    assert (b.leader(), b.standbys()) == ("10.0.0.2:7400", [])
    assert events["10.0.0.2:7400"] == ["elected"]


def test_a_leader_whose_session_expires_is_deposed_fenced_and_stands_by(zookeeper, contenders):
    (a, b), events = contenders("coordinator-a", "coordinator-b")
    wait_until(lambda: a.leading, 5, "a to lead")
    table = a.store.write("table", {"epoch": 1}, version=None, fence=a)
    node = a.node

    deposed = threading.Event()
    a.on_deposed = deposed.set
    expire_session(zookeeper.hosts, a.store.client)
    wait_until(lambda: b.leading, 5, "b to take over")
    assert deposed.wait(5) and not a.leading
    wait_until(lambda: a.standbys() == ["coordinator-a"], 5, "a to stand by behind b")  # its client reconnected

    # the deposed leader's write fails even when made with its old election znode
    a.node = node
    with pytest.raises(NotLeaderError, match="does not lead") as info:
        a.store.write("table", {"epoch": 2}, version=table.version, fence=a)
    assert info.value.data["leader"] == "coordinator-b"
    a.node = None
    with pytest.raises(NotLeaderError):
        a.store.write("table", {"epoch": 2}, version=table.version, fence=a)

    newer = b.store.write("table", {"epoch": 2}, version=table.version, fence=b)
    assert b.store.read("table") == newer and newer.data == {"epoch": 2}
    assert events["coordinator-b"] == ["elected"]


def test_stopping_the_leader_hands_over_and_a_stopped_standby_leaves_the_election(contenders):
    (a, b, c), _ = contenders("a", "b", "c")
    wait_until(lambda: a.leading, 5, "a to lead")
    c.stop()
    assert a.contenders() == ["a", "b"]
    a.stop()
    wait_until(lambda: b.leading, 3, "b to take over")
    assert b.contenders() == ["b"]


LEADER_PROCESS = """
import sys, threading
from rockstate.cluster.zkstore import ZooKeeperStore
store = ZooKeeperStore(sys.argv[1], sys.argv[2], timeout=5.0, session_timeout=float(sys.argv[3]))
store.leadership("killed-leader", on_elected=lambda: print("leading", flush=True)).start()
threading.Event().wait()
"""


def test_a_standby_leads_within_the_session_timeout_after_the_leaders_process_is_killed(zookeeper, cluster, open_store):
    session_timeout = 1.5
    leader = subprocess.Popen([sys.executable, "-c", LEADER_PROCESS, zookeeper.hosts, cluster, str(session_timeout)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert leader.stdout.readline().strip() == "leading"
        standby = open_store().leadership("standby").start()
        wait_until(lambda: standby.contenders() == ["killed-leader", "standby"], 5, "the standby to queue")
        os.kill(leader.pid, signal.SIGKILL)  # no goodbye: ZooKeeper ends the session when its timeout passes
        killed = time.monotonic()
        wait_until(lambda: standby.leading, session_timeout + 5, "the standby to take over")
        took = time.monotonic() - killed
        assert took <= session_timeout + 1.0, f"the standby led {took:.2f}s after the kill"
        assert standby.contenders() == ["standby"]
    finally:
        leader.kill()
        leader.wait()
