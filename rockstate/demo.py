"""``make demo`` / ``rockstate demo``: rockstate end to end on this machine.

Embedded mode first (a store in a directory), then a 3-node cluster of real
processes on 127.0.0.1 that takes a node join and a graceful leave while it
holds the data. Every step is verified; the exit code is 0 only if all are.
(The CDC pipeline on PySpark replaces this once the Spark layer lands.)
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from rich.console import Console
from rich.table import Table

import rockstate
from rockstate.cluster.local import LocalCluster

KEYS = 100_000


def _embedded(path: str, rows: list) -> None:
    with rockstate.open(path, partitions=32) as rs:
        orders = rs.value_state("orders")
        t = time.perf_counter()
        orders.put_many({i: {"customer": i % 977, "amount": i * 0.01} for i in range(KEYS)})
        put_s = time.perf_counter() - t
        t = time.perf_counter()
        got = orders.get_many(range(KEYS))
        get_s = time.perf_counter() - t
        ok = got == [{"customer": i % 977, "amount": i * 0.01} for i in range(KEYS)]
        rows.append(["embedded: put_many + get_many", f"{KEYS:,} keys, {KEYS / put_s:,.0f} puts/s, {KEYS / get_s:,.0f} gets/s", ok])
        sessions = rs.map_state("sessions", ttl=3600)
        sessions.put("user-1", "cart", ["book", "pen"])
        rows.append(["embedded: map state with TTL", str(dict(sessions.items("user-1"))), sessions.get("user-1", "cart") == ["book", "pen"]])
    with rockstate.open(path, partitions=32) as rs:
        rows.append(["embedded: reopen restores", f"{rs.value_state('orders').count():,} keys", rs.value_state("orders").count() == KEYS])


def _cluster(root: str, rows: list, console: Console) -> None:
    with LocalCluster(nodes=3, partitions=24, root=root) as cluster:
        console.print(f"cluster up: coordinator {cluster.address}, nodes {[n.node_id for n in cluster.nodes()]}")
        with cluster.connect() as rs:
            state = rs.value_state("orders")
            state.put_many({i: i * 2 for i in range(KEYS)})
            rows.append(["cluster: 3 nodes, routed batch writes", f"{state.count():,} keys", state.count() == KEYS])
            joined = cluster.add_node()
            status = cluster.wait_balanced()
            per_node = ", ".join(f"{n['node_id']}={n['partitions']}" for n in status["nodes"] if n["status"] == "alive")
            rows.append([f"cluster: {joined.node_id} joins, partitions move", per_node, state.get_many(range(KEYS)) == [i * 2 for i in range(KEYS)]])
            leaving = cluster.nodes()[0].node_id
            cluster.stop_node(leaving)
            status = cluster.wait_balanced()
            per_node = ", ".join(f"{n['node_id']}={n['partitions']}" for n in status["nodes"] if n["status"] == "alive")
            rows.append([f"cluster: {leaving} leaves gracefully", per_node, state.get_many(range(KEYS)) == [i * 2 for i in range(KEYS)]])


def main(args: argparse.Namespace | None = None) -> int:
    console = Console()
    rows: list = []
    with tempfile.TemporaryDirectory(prefix="rockstate-demo-") as tmp:
        path = getattr(args, "path", None) or os.path.join(tmp, "embedded")
        _embedded(path, rows)
        _cluster(os.path.join(tmp, "cluster"), rows, console)
    table = Table("step", "result", "verified")
    for step, result, ok in rows:
        table.add_row(step, result, "[green]yes[/]" if ok else "[red]NO[/]")
    console.print(table)
    ok = all(r[2] for r in rows)
    console.print("[bold green]OK[/]" if ok else "[bold red]FAILED[/]")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
