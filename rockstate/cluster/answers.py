"""The coordinator's cluster-wide answers, put together from the nodes' and its own state (no I/O)."""

from __future__ import annotations

from typing import Iterable

from ..control.membership import Member
from ..store import StateSpec
from .table import Table


def merge_stats(specs: dict[str, StateSpec], answers: Iterable[tuple[str, dict]]) -> dict:
    """Entries and bytes per state, per node and per partition, from each node's ``NodeStats`` answer."""
    states = {n: {"kind": s.kind, "ttl": s.ttl, "keys": 0, "bytes": 0} for n, s in specs.items()}
    nodes, partitions = {}, {}
    for node_id, answer in answers:
        for name, row in answer["states"].items():
            states.setdefault(name, {"kind": row["kind"], "ttl": row["ttl"], "keys": 0, "bytes": 0})
            states[name]["keys"] += row["keys"]
            states[name]["bytes"] += row["bytes"]
        node_row = {"partitions": len(answer["partitions"]), "keys": 0, "bytes": 0}
        for pid, row in answer["partitions"].items():
            partitions[int(pid)] = {**row, "node": node_id}
            node_row["keys"] += row["keys"]
            node_row["bytes"] += row["bytes"]
        nodes[node_id] = node_row
    return {"states": states, "nodes": nodes, "partitions": partitions}


def table_status(table: Table, members: Iterable[Member], now: float) -> dict:
    """The table's epoch, and each member with its status, partitions and last heartbeat."""
    counts: dict[str | None, int] = {}
    for owner in table.owners:
        counts[owner] = counts.get(owner, 0) + 1
    return {
        "epoch": table.epoch,
        "partitions": table.partitions,
        "unassigned": counts.get(None, 0),
        "nodes": [
            {"node_id": m.node_id, "address": m.address, "status": m.status,
             "partitions": counts.get(m.node_id, 0), "last_seen": round(now - m.last_seen, 2)}
            for m in sorted(members, key=lambda m: m.node_id)
        ],
    }
