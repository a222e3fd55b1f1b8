"""The key-value chaos run: single-key reads, writes and compare-and-sets through a seeded schedule of node kills
and restarts, joins, graceful leaves and network partitions, judged by the history checker.

``python -m rockstate.testing.kv_chaos --seed 3`` (``make chaos`` runs several seeds; ``tests/chaos`` a short
one). A multi-process cluster with backups serves client threads (``workload.Workload``) that record every
operation, while the chaos loop carries out one action at a time, drawn from the seed: SIGKILL of a node, the
restart of a killed one with its data directory, a node added, a node removed gracefully, and with ``--netns``
(root: every process on a host of its own, ``netns.Network``) a node cut off from the coordinator and the other
nodes for a random while, then healed. After each action it waits until the cluster is whole again (every
partition's primary alive and its backups in sync) and every client made progress; either not happening in
time fails the run. At the end every key is read once more, and the history must be linearizable with no
documented loss and nothing restored from a checkpoint: with one failure at a time, backups lose nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import sys
import tempfile
import time

from ..local.cluster import LocalCluster, wait_until
from .history import check_history
from .recording import History
from .workload import Workload, keys_for, read_back

KINDS = ("kill", "restart", "add", "remove", "cut")
MIN_NODES, MAX_NODES = 2, 4  # running nodes never fewer (a backup each) nor more (a small machine)
SETTLE = 120.0  # longest wait for the cluster to be whole again after an action


def draw_schedule(seed: int, actions: int, nodes: int = 3, cuts: bool = True) -> list[tuple[str, float]]:
    """(kind, seconds) per action: the seconds a cut lasts (shorter or longer than a heartbeat timeout of 2 s)."""
    rng = random.Random(seed)
    running, killed, schedule = nodes, 0, []
    for _ in range(actions):
        possible = [k for k in KINDS if (k in ("kill", "remove") and running > MIN_NODES) or (k == "restart" and killed)
                    or (k == "add" and running + killed < MAX_NODES) or (k == "cut" and cuts and running > MIN_NODES)]
        kind = rng.choice(possible)
        running += {"kill": -1, "remove": -1, "restart": 1, "add": 1}.get(kind, 0)
        killed += {"kill": 1, "restart": -1}.get(kind, 0)
        schedule.append((kind, round(rng.uniform(1.0, 5.0), 1) if kind == "cut" else 0.0))
    return schedule


class Run:
    def __init__(self, args: argparse.Namespace, cluster: LocalCluster, network) -> None:
        self.args, self.cluster, self.network = args, cluster, network
        self.rng = random.Random(args.seed * 7919)
        self.killed: list[str] = []

    def host(self, node_id: str) -> str:
        return os.path.basename(self.cluster.node(node_id).data_dir)

    def alive(self, node_id: str) -> bool:
        return any(n["node_id"] == node_id and n["status"] == "alive" for n in self.cluster.status()["nodes"])

    def wait_whole(self, gone: str | None = None) -> None:
        """Every partition's primary alive and its backups in sync (``gone``: a node first declared not alive)."""
        if gone:
            wait_until(lambda: not self.alive(gone), SETTLE, f"{gone} declared gone")
        self.cluster.wait_replicated(SETTLE)

    def act(self, kind: str, seconds: float) -> str:
        running = sorted(n.node_id for n in self.cluster.nodes())
        if kind == "kill":
            victim = self.rng.choice(running)
            self.cluster.kill_node(victim)
            self.killed.append(victim)
            self.wait_whole(gone=victim)
            return f"SIGKILL {victim}"
        if kind == "restart":
            back = self.killed.pop(0)
            self.cluster.restart_node(back)
            wait_until(lambda: self.alive(back), SETTLE, f"{back} alive again")
            self.wait_whole()
            return f"restarted {back}"
        if kind == "add":
            info = self.cluster.add_node(wait=False)
            self.wait_whole()
            return f"added {info.node_id}"
        if kind == "remove":
            leaving = self.rng.choice(running)
            self.cluster.stop_node(leaving)
            self.wait_whole()
            return f"removed {leaving} gracefully"
        victim = self.rng.choice(running)
        others = ["coordinator", *(self.host(n) for n in running if n != victim)]
        self.network.isolate(self.host(victim), *others)
        time.sleep(seconds)  # the cut's length is the action (drawn from the seed)
        self.network.heal_all()
        wait_until(lambda: self.alive(victim), SETTLE, f"{victim} alive after the heal")
        self.wait_whole()
        return f"cut {victim} off for {seconds:g}s"


def run(args: argparse.Namespace) -> bool:
    if args.netns:
        from .netns import refused

        why = refused()
        if why:
            print(f"no network namespaces here ({why}): no cuts in this run")
            args.netns = False
    schedule = draw_schedule(args.seed, args.actions, args.nodes, cuts=args.netns)
    print(f"key-value chaos seed {args.seed}: {', '.join(k + (f' {s:g}s' if s else '') for k, s in schedule)}", flush=True)
    history = History()
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        network = None
        if args.netns:
            from .netns import Network

            network = stack.enter_context(Network())
        root = stack.enter_context(tempfile.TemporaryDirectory(prefix="rockstate-kv-chaos-"))
        cluster = stack.enter_context(LocalCluster(nodes=args.nodes, partitions=args.partitions, root=root,
                                                   heartbeat_timeout=args.heartbeat_timeout, backup_count=args.backup_count,
                                                   hosts=network.place if network else None))
        admin = stack.enter_context(cluster.connect(retry_timeout=60))
        keys = keys_for(admin, per_partition=2)
        chaos = Run(args, cluster, network)
        with Workload(cluster, history, keys, threads=args.clients, seed=args.seed) as load:
            load.wait_ops(10, timeout=60)
            for kind, seconds in schedule:
                at = time.monotonic() - started
                try:
                    what = chaos.act(kind, seconds)
                    load.wait_ops(5, timeout=60)  # every client goes on
                except Exception:
                    kept = shutil.copytree(os.path.join(root, "logs"), tempfile.mkdtemp(prefix=f"rockstate-kv-chaos-{args.seed}-logs-"),
                                           dirs_exist_ok=True)  # the cluster's directory goes with the run
                    print(f"  {at:6.1f}s  {kind} failed; the processes' logs are kept in {kept}", flush=True)
                    raise
                print(f"  {at:6.1f}s  {what}; whole again after {time.monotonic() - started - at:.1f}s", flush=True)
        read_back(admin, history, keys)
        events = [e["event"] for e in admin.backend.events()]
    report = check_history(history)
    restored = events.count("partition_restored")
    print(f"{report}; {load.kinds()}; events: {events.count('primary_promoted')} promotions, {restored} restores "
          f"from a checkpoint; {time.monotonic() - started:.0f}s")
    return report.ok and not report.documented_loss and not restored


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rockstate.testing.kv_chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, nargs="+", default=[3], help="one run per seed (default 3)")
    parser.add_argument("--actions", type=int, default=8, help="actions per run (default 8)")
    parser.add_argument("--nodes", type=int, default=3, help="nodes to start with (default 3)")
    parser.add_argument("--partitions", type=int, default=8, help="partitions (default 8)")
    parser.add_argument("--clients", type=int, default=6, help="client threads (default 6)")
    parser.add_argument("--backup-count", type=int, default=1, help="backups per partition (default 1)")
    parser.add_argument("--heartbeat-timeout", type=float, default=2.0, help="seconds (default 2)")
    parser.add_argument("--netns", action="store_true", help="every process on a host of its own; adds network cuts (root)")
    args = parser.parse_args(argv)
    ok = True
    for seed in args.seed:
        passed = run(argparse.Namespace(**{**vars(args), "seed": seed}))
        print(f"key-value chaos seed {seed}: {'OK' if passed else 'FAILED'}", flush=True)
        ok = ok and passed
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
