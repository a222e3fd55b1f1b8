"""`scripts/node_cpu.py` (the nodes' CPU per key of batch puts, docs/performance.md) still works: a short run on a
real cluster prints its figures, each a number that can only come from measuring."""

from __future__ import annotations

import os
import re
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), os.pardir, "scripts", "node_cpu.py")


def test_a_short_run_prints_the_nodes_cpu_a_key_and_their_wake_ups(tmp_path):
    result = subprocess.run([sys.executable, SCRIPT, "--nodes", "2", "--partitions", "16", "--keys", "4000", "--batch", "1000",
                             "--seconds", "1"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    line = result.stdout.strip().splitlines()[-1]
    found = re.fullmatch(r"2 nodes, P=16, backup_count=1, 1,000-key batches: median ([\d,]+) keys/s; nodes' CPU ([\d.]+) µs a key, "
                         r"([\d.]+) ms a batch; wake-ups a batch (\d+) \(preempted (\d+)\); client's CPU ([\d.]+) µs a key", line)
    assert found, line
    keys_per_s, per_key, per_batch = int(found[1].replace(",", "")), float(found[2]), float(found[3])
    assert keys_per_s > 0 and per_key > 0 and per_batch > 0
    assert abs(per_batch - per_key) / per_key < 0.05  # ms a batch of 1,000 keys is µs a key: the two agree (rounded)
    assert int(found[4]) > 0  # a replicated put wakes the nodes
