"""The exactly-once CDC pipeline (`rockstate demo --ha`) with three coordinators on ZooKeeper: the leader SIGKILLed mid-run."""

import subprocess
import sys

import pytest


@pytest.mark.timeout(600)  # the run's own timeout: a loaded machine takes several times its ~1 minute
def test_the_pipeline_is_exact_when_the_leading_coordinator_is_killed_mid_run():
    result = subprocess.run([sys.executable, "-m", "rockstate.cli", "demo", "--ha", "--events", "6000", "--files", "4", "--no-failure"],
                            capture_output=True, text=True, timeout=600)
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert "killed the leading coordinator" in out and " led " in out and "(not seen)" not in out
    assert out.rstrip().endswith("OK")
