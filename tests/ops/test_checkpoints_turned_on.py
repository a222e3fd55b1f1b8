"""Checkpoints turned on for a running cluster (issue 31, item 3): nodes registered before the coordinator had a
storage do not know it; `checkpoint trigger` is refused naming them, and a refused checkpoint leaves no ABORTED
entry in the history."""

import pytest

from rockstate.config import CheckpointConfig
from rockstate.errors import CheckpointsNotConfiguredError
from rockstate.local.cluster import wait_until
from rockstate.testing.cluster import gen_cluster


@gen_cluster(nodes=2, partitions=4)
def test_a_refused_checkpoint_names_the_nodes_to_restart_and_leaves_no_aborted_entry(cluster, tmp_path):
    cluster.wait_balanced()
    with cluster.connect() as rs:
        rs.value_state("counts").put("a", 1)
    cluster.kill_coordinator()
    cluster.restart_coordinator(checkpoints=CheckpointConfig(url=f"file://{tmp_path}/checkpoints"))
    wait_until(lambda: cluster.status()["checkpoints"] is not None and cluster.status()["unavailable"] == 0, 30,
               "the coordinator back, with checkpoints")
    nodes = sorted(n.node_id for n in cluster.nodes())
    with cluster.connect() as rs:
        with pytest.raises(CheckpointsNotConfiguredError) as refused:
            rs.checkpoint()
        assert all(n in str(refused.value) for n in nodes) and "restart" in str(refused.value), refused.value
        assert rs.checkpoints() == [], "a refused checkpoint leaves nothing in the history"
    for node in nodes:  # restarted, each registers again and learns the storage
        cluster.stop_node(node)
        cluster.restart_node(node)
    cluster.wait_balanced()
    with cluster.connect() as rs:
        rs.checkpoint()
        assert [str(c.state) for c in rs.checkpoints()] == ["COMPLETED"], rs.checkpoints()
