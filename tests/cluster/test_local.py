"""LocalCluster's server processes end with the process that started them (a test or demo killed by a timeout
leaves none behind to load the machine)."""

import json
import os
import subprocess
import sys

from rockstate.local.cluster import wait_until

STARTER = """
import json, os, sys
from rockstate import LocalCluster
cluster = LocalCluster(nodes=2, partitions=4, root=sys.argv[1]).start()
with open(os.path.join(sys.argv[1], "coordinator", "address.json")) as f:
    coordinator = json.load(f)["pid"]
print(json.dumps([coordinator] + [n.pid for n in cluster.nodes()]), flush=True)
sys.stdin.read()  # until killed
"""


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended, only not been reaped
    except FileNotFoundError:
        return False


def test_a_local_clusters_processes_end_when_the_process_that_started_them_is_killed(tmp_path):
    starter = subprocess.Popen([sys.executable, "-c", STARTER, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        pids = json.loads(starter.stdout.readline())
        assert len(pids) == 3 and all(running(pid) for pid in pids)
    finally:
        starter.kill()
        starter.wait()
    wait_until(lambda: not any(running(pid) for pid in pids), 30, f"the coordinator and nodes {pids} to end", interval=0.2)
