"""Settings on a running cluster (issue 31 item 3). Checkpoints turned on, or moved: the coordinator tells every node its
checkpoint storage once it leads -- at the node's next heartbeat, and before it answers a checkpoint request -- so
nodes that keep running take part at once. A node that cannot learn it live (one of a version without
``SetCheckpoints``) is named in a refusal that leaves no ABORTED entry in the history. A setting a node takes only when it registers
(the size limits, the heartbeat timeout), changed on the coordinator: `rockstate status` names the nodes to restart."""

import glob
import os

import pytest

from rockstate.config import CheckpointConfig
from rockstate.errors import CheckpointsNotConfiguredError
from rockstate.local.cluster import wait_until
from rockstate.testing.cluster import gen_cluster


def restart_coordinator_with(cluster, url: str) -> None:
    cluster.kill_coordinator()
    cluster.restart_coordinator(checkpoints=CheckpointConfig(url=url))
    wait_until(lambda: (cluster.status().get("checkpoints") or {}).get("url") == url and cluster.status()["unavailable"] == 0,
               30, "the coordinator back, with the storage")


def told(cluster, url: str) -> set:
    return {e["node"] for e in cluster.status()["events"] if e["event"] == "member_checkpoints" and e.get("url") == url}


def metadata(root: str) -> list:
    return glob.glob(os.path.join(root, "**", "_metadata"), recursive=True)


@gen_cluster(nodes=2, partitions=4, processes=True)
def test_running_nodes_take_a_storage_set_or_moved_on_a_restarted_coordinator(cluster, tmp_path):
    cluster.wait_balanced()
    processes = {n.node_id: n.pid for n in cluster.nodes()}
    with cluster.connect() as rs:
        rs.value_state("counts").put_many({i: i for i in range(50)})

    first = f"file://{tmp_path}/checkpoints"
    restart_coordinator_with(cluster, first)
    wait_until(lambda: told(cluster, first) == set(processes), 30, "every node told the storage at its heartbeat")
    with cluster.connect() as rs:
        rs.checkpoint()
        assert [str(c.state) for c in rs.checkpoints()] == ["COMPLETED"], rs.checkpoints()
    assert len(metadata(f"{tmp_path}/checkpoints")) == 1

    restart_coordinator_with(cluster, f"file://{tmp_path}/elsewhere")  # moved: asked at once, before any heartbeat tells
    with cluster.connect() as rs:
        rs.checkpoint()
        assert [str(c.state) for c in rs.checkpoints()] == ["COMPLETED"], rs.checkpoints()
    assert len(metadata(f"{tmp_path}/elsewhere")) == 1 and len(metadata(f"{tmp_path}/checkpoints")) == 1
    assert {n.node_id: n.pid for n in cluster.nodes()} == processes, "no node was restarted"


@gen_cluster(nodes=2, partitions=4)
def test_a_node_that_cannot_learn_the_storage_live_is_named_and_no_aborted_entry_is_left(cluster, tmp_path):
    cluster.wait_balanced()
    old, other = sorted(n.node_id for n in cluster.nodes())
    # the node answers SetCheckpoints as a node of a version without it does: an unknown operation
    cluster._runner.nodes[old].server._handlers.pop("set_checkpoints")
    restart_coordinator_with(cluster, f"file://{tmp_path}/checkpoints")
    with cluster.connect() as rs:
        with pytest.raises(CheckpointsNotConfiguredError) as refused:
            rs.checkpoint()
        assert old in str(refused.value) and other not in str(refused.value) and "restart" in str(refused.value), refused.value
        assert rs.checkpoints() == [], "a refused checkpoint leaves nothing in the history"
    cluster.stop_node(old)  # restarted, it registers again and learns the storage
    cluster.restart_node(old)
    cluster.wait_balanced()
    with cluster.connect() as rs:
        rs.checkpoint()
        assert [str(c.state) for c in rs.checkpoints()] == ["COMPLETED"], rs.checkpoints()


@pytest.fixture
def browser(tmp_path):
    """Headless Chromium when installed (scripts/setup.sh installs it), else None: the page's part is left out."""
    from .test_status_page import CHROMEDRIVER, CHROMIUM, chromium

    if not (CHROMIUM and CHROMEDRIVER):
        yield None
        return
    with chromium(tmp_path) as driver:
        yield driver


@gen_cluster(nodes=2, partitions=4, processes=True)
def test_the_status_names_the_nodes_to_restart_for_a_setting_taken_at_registration(cluster, browser):
    from .test_cli_status import run

    cluster.wait_balanced()
    nodes = sorted(n.node_id for n in cluster.nodes())
    cluster.kill_coordinator()
    cluster.restart_coordinator(max_value_bytes=1 << 20)  # a node checks writes against the limit it registered with
    wait_until(lambda: cluster.status()["unavailable"] == 0, 30, "the coordinator back")
    status = run("status", "--coordinator", cluster.address)
    assert status.returncode == 1, status.stdout  # degraded
    first, *rest = status.stdout.splitlines()
    assert f"restart {', '.join(nodes)}: they run with settings the coordinator changed" in first, status.stdout
    assert f"{nodes[0]} (max_value_bytes); {nodes[1]} (max_value_bytes)" in " ".join(" ".join(rest).split()), status.stdout
    if browser is not None:  # the status page says the same
        browser.get(cluster.status_url)
        shown = wait_until(lambda: browser.execute_script("const r = document.getElementById('restart'); return r && r.textContent"),
                           30, "the page's restart line")
        assert shown.startswith(f"restart {nodes[0]} (max_value_bytes); {nodes[1]} (max_value_bytes)"), shown
    for i, node in enumerate(nodes):
        cluster.stop_node(node)
        cluster.restart_node(node)
        cluster.wait_balanced()
        assert cluster.status()["restart"] == {n: ["max_value_bytes"] for n in nodes[i + 1:]}
    cluster.wait_replicated()  # balanced is not yet in sync: a restarted node's backup copies may still be coming
    status = run("status", "--coordinator", cluster.address)
    assert status.returncode == 0 and "HEALTHY" in status.stdout.splitlines()[0], status.stdout
