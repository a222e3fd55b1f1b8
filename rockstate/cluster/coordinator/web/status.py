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
from typing import Callable, Iterable

from ....control.membership import Member, MemberStatus
from ....rpc.async_client import AsyncChannel
from ... import protocol as p
from ...table import Table

FIGURES_TIMEOUT = 1.0
FIGURES_EVERY = 2.0  # the page refreshes every 2 s
EVENTS = 100  # recent events in the document
MOVES = ("migration_started", "migration_finished", "migration_failed")
LIVE = (MemberStatus.ALIVE, MemberStatus.LEAVING)  # statuses whose partitions are served


def table_status(table: Table, members: Iterable[Member], now: float) -> dict:
    """The table's epoch, and each member with its status ("suspect": alive but silent, ``Member.shown``),
    partitions and last heartbeat."""
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
            {"node_id": m.node_id, "address": m.address, "status": m.shown, "zone": getattr(m, "zone", None),
             "partitions": counts.get(m.node_id, 0), "last_seen": round(now - m.last_seen, 2)}
            for m in members
        ],
    }


class Figures:
    """The live nodes' figures, kept for ``FIGURES_EVERY`` seconds: ``alive()`` the live members,
    ``channel(node_id)`` a connection to one."""

    def __init__(self, alive: Callable[[], list[Member]], channel: Callable[[str], AsyncChannel]) -> None:
        self._alive, self._channel = alive, channel
        self.at = float("-inf")
        self.by_node: dict[str, dict | None] = {}

    async def get(self) -> dict[str, dict | None]:
        if time.monotonic() - self.at >= FIGURES_EVERY:
            self.at = time.monotonic()  # first: readers meanwhile take the figures there are
            self.by_node = await self._ask()
        return self.by_node

    async def _ask(self) -> dict[str, dict | None]:
        alive = self._alive()

        async def one(member: Member) -> dict | None:
            try:
                return await self._channel(member.node_id).call(p.NodeFigures(), timeout=FIGURES_TIMEOUT)
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


def cluster_status(status: dict, figures: dict[str, dict | None], events: list[dict], *, states: int, coordinators: dict, failovers: Iterable[str], backup_count: int,
                   replication: str, replicas: list[dict], pipelines: Iterable[dict], checkpoints: dict | None) -> dict:
    """The document, from what the coordinator read for it: ``status`` its ``table_status``, ``events`` the recent
    ones (moves in flight are told from them), ``checkpoints`` the storage's url, latest and history (None: none)."""
    for node in status["nodes"]:
        node["figures"] = figures.get(node["node_id"])
    return {
        **status,
        "states": states,
        "coordinators": coordinators,
        "moves": _moves(events),
        "failovers": sorted(failovers),
        "backup_count": backup_count,
        "replication": replication,
        "replicas": replicas,  # primary, backups, in sync
        "events": events[-EVENTS:],
        "pipelines": sorted(pipelines, key=lambda r: -r.get("updated", 0)),
        "checkpoints": None if checkpoints is None else {**checkpoints, "recent": checkpoints["history"][-5:]},
    }
