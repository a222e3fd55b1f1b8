"""The main job, small: `rockstate demo` runs the CDC pipeline through a kill and a join and verifies it."""

import subprocess
import sys

import pytest


@pytest.mark.timeout(600)  # the run's own timeout: a loaded machine takes several times its ~1 minute
def test_demo_verifies_the_materialized_table():
    result = subprocess.run([sys.executable, "-m", "rockstate.cli", "demo", "--events", "6000", "--files", "4"],
                            capture_output=True, text=True, timeout=600)
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert "killed state node" in out and "partitions promoted to their in-sync backups" in out and "no rewind" in out
    assert "joined" in out and "partitions moved to" in out
    assert out.rstrip().endswith("OK")
