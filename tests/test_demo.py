"""The main job, small: `rockstate demo --ha` runs the CDC pipeline on three coordinators (ZooKeeper) through a
state node SIGKILLed, the leading coordinator SIGKILLed and a node joining, and verifies the materialized table.

One run covers what `make demo` shows (the node kill and the join; its single coordinator is every other
cluster test's) and the leader's death on top: each run costs a Spark session and a cluster.
"""

import subprocess
import sys

import pytest


@pytest.mark.timeout(600)  # the run's own timeout: a loaded machine takes several times its ~1 minute
def test_the_demo_is_exact_through_a_node_kill_a_leader_kill_and_a_join():
    result = subprocess.run([sys.executable, "-m", "rockstate.cli", "demo", "--ha", "--events", "6000", "--files", "4"],
                            capture_output=True, text=True, timeout=600)
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert "killed state node" in out and "partitions promoted to their in-sync backups" in out and "no rewind" in out
    assert "killed the leading coordinator" in out and " led " in out and "(not seen)" not in out
    assert "joined" in out and "partitions moved to" in out
    assert out.rstrip().endswith("OK")
