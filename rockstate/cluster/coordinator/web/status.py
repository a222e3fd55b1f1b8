"""The cluster's status as one JSON document: the status page, ``/api/status`` and ``rockstate status --json`` all show it.

Node figures (memory, disk, RocksDB) are asked of every live node at once,
each given ``FIGURES_TIMEOUT``: a node that does not answer in time is shown
without them, never holds the page up. They are asked at most every
``FIGURES_EVERY`` seconds however often the status is read (tests and
``LocalCluster.wait_balanced`` poll it many times a second).
"""

from __future__ import annotations

import asyncio
import time
from typing import Iterable

from ... import protocol as p

FIGURES_TIMEOUT = 1.0
FIGURES_EVERY = 2.0  # the page refreshes every 2 s
EVENTS = 100  # recent events in the document
MOVES = ("migration_started", "migration_finished", "migration_failed")
LIVE = ("alive", "leaving")  # statuses whose partitions are served


def table_status(table, members: Iterable, now: float) -> dict:
    """The table's epoch, and each member with its status, partitions and last heartbeat."""
    counts: dict[str | None, int] = {}
    for owner in table.owners:
        counts[owner] = counts.get(owner, 0) + 1
    members = sorted(members, key=lambda m: m.node_id)
    live = {m.node_id for m in members if m.status in LIVE}
    return {
        "epoch": table.epoch,
        "partitions": table.partitions,
        "unassigned": counts.get(None, 0),
        "unavailable": sum(o not in live for o in table.owners),  # no live owner: unassigned, or on a dead node
        "owners": list(table.owners),
        "nodes": [
            {"node_id": m.node_id, "address": m.address, "status": str(m.status), "zone": getattr(m, "zone", None),
             "partitions": counts.get(m.node_id, 0), "last_seen": round(now - m.last_seen, 2)}
            for m in members
        ],
    }


class Figures:
    """The live nodes' figures, kept for ``FIGURES_EVERY`` seconds."""

    def __init__(self) -> None:
        self.at, self.by_node = float("-inf"), {}

    async def get(self, coordinator) -> dict[str, dict | None]:
        if time.monotonic() - self.at >= FIGURES_EVERY:
            self.at = time.monotonic()  # first: readers meanwhile take the figures there are
            self.by_node = await _ask_figures(coordinator)
        return self.by_node


async def _ask_figures(coordinator) -> dict[str, dict | None]:
    alive = coordinator.membership.alive()

    async def one(member):
        try:
            return await coordinator.peer(member.node_id).rpc(coordinator.security).call(p.NodeFigures(), timeout=FIGURES_TIMEOUT)
        except Exception:  # noqa: BLE001 -- a slow or older node is shown without figures
            return None

    answers = await asyncio.gather(*(one(m) for m in alive))
    return {m.node_id: a for m, a in zip(alive, answers)}


def _moves(events: list[dict]) -> list[dict]:
    """Moves in flight: started, neither finished nor failed (as far as the recent events tell)."""
    moving: dict[int, dict] = {}
    for e in events:
        if e["event"] == "migration_started":
            moving[e["partition"]] = {"partition": e["partition"], "source": e["source"], "target": e["target"], "since": e["time"]}
        elif e["event"] in MOVES:
            moving.pop(e["partition"], None)
    return sorted(moving.values(), key=lambda m: m["partition"])


async def cluster_status(coordinator) -> dict:
    c = coordinator
    status = table_status(c.table, c.members.values(), time.monotonic())
    figures = await c.web.figures.get(c)
    for node in status["nodes"]:
        node["figures"] = figures.get(node["node_id"])
    events = c.events.latest(1000)
    history = c.checkpoints.history() if c.checkpoints is not None else []
    return {
        **status,
        "states": len(c.specs),
        "coordinators": await c.coordinators(),
        "moves": _moves(events),
        "failovers": sorted(c.failovers),
        "backup_count": c.config.backup_count,
        "replication": c.config.replication,
        "replicas": c.replicas.status() if c.replicas.enabled else [],  # primary, backups, in sync
        "events": events[-EVENTS:],
        "pipelines": sorted(c.pipelines.values(), key=lambda r: -r.get("updated", 0)),
        "checkpoints": None if c.checkpoints is None else {
            "url": c.checkpoint_config.url, "latest": c.checkpoints.latest(), "history": history, "recent": history[-5:]},
    }
