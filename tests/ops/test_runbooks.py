"""The runbooks quote what `rockstate status` prints: run their commands on a real cluster and check the quotes."""

import os
import pathlib
import re
import subprocess
import sys

from rockstate import LocalCluster
from rockstate.local.cluster import wait_until

RUNBOOKS = pathlib.Path(__file__).parents[2] / "docs" / "runbooks"


def status(address: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROCKSTATE_") and k != "COLUMNS"}
    return subprocess.run([sys.executable, "-m", "rockstate.cli", "status", "--coordinator", address],
                          capture_output=True, text=True, timeout=60, env=env)


def test_upgrading_a_node_at_a_time_waits_for_what_status_prints(tmp_path):
    """upgrading.md, step 3: SIGTERM a node, start it again, `until rockstate status; do sleep; done`."""
    runbook = " ".join((RUNBOOKS / "upgrading.md").read_text().split())
    quoted = ["cluster at C: HEALTHY", "every partition has a live owner", "every backup in sync",
              "DEGRADED: N partitions short of in-sync backups"]
    assert "until rockstate status --coordinator C; do sleep 5; done" in runbook
    assert all(f"`{q}" in runbook for q in quoted), "the runbook quotes these"
    new_cluster = " ".join((RUNBOOKS / "new-cluster-from-savepoint.md").read_text().split())
    assert "`every partition has a live owner`" in new_cluster
    with LocalCluster(nodes=2, partitions=8, processes=True, root=str(tmp_path)) as c:
        c.wait_replicated()
        node = c.nodes()[0].node_id
        c.stop_node(node)  # SIGTERM: it hands its partitions over and exits
        during = status(c.address)
        assert during.returncode == 1, during.stdout + during.stderr
        assert re.match(rf"cluster at {re.escape(c.address)}: DEGRADED: \d+ partitions short of in-sync backups",
                        during.stdout), during.stdout
        c.restart_node(node)
        healthy = wait_until(lambda: (r := status(c.address)).returncode == 0 and r, 120, "rockstate status to exit 0")
        out = " ".join(healthy.stdout.split())
        assert out.startswith(f"cluster at {c.address}: HEALTHY")
        assert "every partition has a live owner" in out and "every backup in sync" in out
        assert re.search(r"nodes 2 alive\b", out), out
