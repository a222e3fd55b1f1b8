"""Pre-handshake attacks on a real node process: a well-behaved client's p50/p99 and the node's RSS, idle vs under attack.

One node (its own process) with a cluster secret. The client is a ``Channel`` holding an authenticated
connection from before the attack, calling ``NodeStats`` back to back for BENCH_ATTACK_SECONDS (default 3) per row.
Each attack runs in a process of its own (each alone, then all at once):

- frame bomb: connections that greet and announce a 32 MiB frame, sending it, one after another
  (before the limits: +2.35 GB peak RSS for one);
- half-open: 1,000 connections that greet and then say nothing (before: never closed);
- slowloris: 50 connections dribbling a Hello frame a byte every 50 ms, reconnecting when closed.

Each attack row follows an idle row measured just before it (the load of a shared machine drifts); the client's
p99 under attack is compared with that idle p99 (the goal of issue 30: within 2x) and the ratio printed.
Run: ``.venv/bin/python bench/attack.py``.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rockstate.cluster import protocol as p  # noqa: E402
from rockstate.local.cluster import LocalCluster  # noqa: E402
from rockstate.rpc.client import Channel  # noqa: E402
from rockstate.testing.attacks import Flood, frame_bomb, latencies, peak_rss, percentile, rss  # noqa: E402

SECONDS = float(os.environ.get("BENCH_ATTACK_SECONDS", "3"))
SECRET = "bench attack secret"
MiB = 1 << 20


def _attack(kind: str, address: str, stop) -> None:
    """One attack, in a process of its own (the client's latency is not the attacker's GIL), until ``stop`` is set."""
    if kind == "bomb":
        while not stop.is_set():
            frame_bomb(address, 32 * MiB)
        return
    flood = Flood(address, n=1000) if kind == "half-open" else Flood(address, n=0, slowloris=50, interval=0.05)
    with flood:
        stop.wait()


class Attack:
    def __init__(self, address: str, *kinds: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.stop = ctx.Event()
        self.procs = [ctx.Process(target=_attack, args=(k, address, self.stop), daemon=True) for k in kinds]

    def __enter__(self):
        for proc in self.procs:
            proc.start()
        time.sleep(2.0)  # the attack under way (the flood's connections open, interpreters started)
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for proc in self.procs:
            proc.join(timeout=30)


def main() -> None:
    with tempfile.TemporaryDirectory() as root, LocalCluster(nodes=1, partitions=4, root=root, secret=SECRET, backup_count=0) as cluster:
        node = cluster.nodes()[0]
        channel = Channel(node.address, timeout=10, secret=SECRET)
        channel.call(p.NodeStats())
        rows = []

        def row(name: str, attack) -> None:
            with attack() if attack else _nothing():
                lat = latencies(lambda: channel.call(p.NodeStats()), SECONDS)
                now = rss(node.pid)
            rows.append((name, len(lat), percentile(lat, 0.5), percentile(lat, 0.99), now, peak_rss(node.pid)))

        attacks = [("frame bomb (32 MiB frames, back to back)", ("bomb",)), ("1,000 half-open connections", ("half-open",)),
                   ("slowloris (50 connections)", ("slowloris",)), ("all three at once", ("bomb", "half-open", "slowloris"))]
        for name, kinds in attacks:  # each attack beside an idle run just before it: a shared machine's load drifts
            row("  idle (just before)", None)
            row(name, lambda kinds=kinds: Attack(node.address, *kinds))
        channel.close()

    print(f"{'row':44} {'calls':>6} {'p50 ms':>8} {'p99 ms':>8} {'p99/idle':>9} {'RSS MiB':>8} {'peak MiB':>9}")
    for i, (name, n, p50, p99, now, peak) in enumerate(rows):
        idle = rows[i - i % 2]
        ratio = p99 / idle[3]
        flag = "" if ratio <= 2 else "  (over 2x)"
        print(f"{name:44} {n:6d} {p50 * 1e3:8.3f} {p99 * 1e3:8.3f} {ratio:8.2f}x {now / MiB:8.1f} {peak / MiB:9.1f}{flag}")


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


if __name__ == "__main__":
    main()
