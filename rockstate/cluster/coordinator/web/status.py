"""The cluster's status as one JSON document: the status page, ``/api/status`` and ``rockstate status --json`` all show it.

What the nodes tell is asked of every live node at once (``Asked``), each
given a timeout: a node that does not answer in time is shown without it,
never holds the page up. Figures (memory, disk, RocksDB, the clients'
requests) are asked at most every ``FIGURES_EVERY`` seconds however often
the status is read (tests and ``LocalCluster.wait_balanced`` poll it many
times a second). The states' and partitions' sizes are ``rs.stats()``'s
(``NodeStats``: exact, every entry read), so they are asked in the background
while the status is read, at most every ``SIZES_EVERY`` seconds and never
more often than ``SIZES_SLOWER`` times the last asking took (a node reads its
entries at most a thirtieth of the time someone watches: a small store's
counts as fresh as the page, a large one's minutes old); the document shows
the last answers and their age.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Callable, Iterable

from ....control.membership import Member, MemberStatus
from ....rpc.async_client import AsyncChannel
from ....store.catalog import state_rows
from ... import protocol as p
from ...table import Table

FIGURES_TIMEOUT = 1.0
FIGURES_EVERY = 2.0  # the page refreshes every 2 s
SIZES_TIMEOUT = 30.0
SIZES_EVERY = FIGURES_EVERY
SLOWER = 10  # an asking that took t seconds is not redone for SLOWER * t seconds
SIZES_SLOWER = 30  # the sizes': every entry read
EVENTS = 100  # recent events in the document
MOVES = ("migration_started", "migration_finished", "migration_failed")
LIVE = (MemberStatus.ALIVE, MemberStatus.LEAVING)  # statuses whose partitions are served
EVENT_TYPE = re.compile(r"^[a-z][a-z0-9_]{0,63}\Z")  # what an event's name may be (events.py's callers name them so)


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


class Asked:
    """One question asked of every live node, the answers kept a while: ``alive()`` the live members,
    ``channel(node_id)`` a connection to one, ``message()`` the question; ``answered(at, by_node)`` is told of
    every new set of answers."""

    def __init__(self, alive: Callable[[], list[Member]], channel: Callable[[str], AsyncChannel],
                 message: Callable[[], p.Message], *, every: float, timeout: float, slower: float = SLOWER,
                 answered: Callable[[float, dict[str, dict | None]], None] | None = None) -> None:
        self._alive, self._channel, self._message, self._answered = alive, channel, message, answered
        self.every, self.timeout, self.slower = every, timeout, slower
        self.at = float("-inf")  # when the answers kept were asked for (monotonic)
        self.took = 0.0
        self.by_node: dict[str, dict | None] = {}
        self._pending: asyncio.Future[dict[str, dict | None]] | None = None

    def _due(self) -> bool:
        return time.monotonic() - self.at >= max(self.every, self.slower * self.took)

    async def get(self) -> dict[str, dict | None]:
        if self._due():
            self.at = started = time.monotonic()  # first: readers meanwhile take the answers there are
            self.by_node = await self._ask()
            self.took = time.monotonic() - started
            if self._answered is not None:
                self._answered(started, self.by_node)
        return self.by_node

    def refresh(self) -> None:
        """Asked again in the background if due (``get`` without waiting for the answers)."""
        if self._due() and (self._pending is None or self._pending.done()):
            self._pending = asyncio.ensure_future(self.get())

    async def keep_fresh(self, period: float) -> None:
        """The leader's task: asked every ``period`` seconds (or as ``get`` allows), whoever reads them."""
        while True:
            await self.get()
            await asyncio.sleep(period)

    async def _ask(self) -> dict[str, dict | None]:
        alive = self._alive()

        async def one(member: Member) -> dict | None:
            try:
                answer = await self._channel(member.node_id).call(self._message(), timeout=self.timeout)
            except Exception:  # noqa: BLE001 -- a slow or older node is shown without its answer
                return None
            return answer if isinstance(answer, dict) else None

        answers = await asyncio.gather(*(one(m) for m in alive))
        return {m.node_id: a for m, a in zip(alive, answers)}


def sizes(stats: dict, partitions: int, age: float) -> dict:
    """The states (``catalog.state_rows``: kind, TTL, keys, bytes, Spark query and operator) and each partition's
    keys and bytes (None: no answer from its owner) from ``stats``, ``rs.stats()``'s answer put together from the
    nodes' (``answers.merge_stats``), asked ``age`` seconds ago."""
    by_pid = stats["partitions"]
    return {"age": round(age, 1), "states": state_rows(stats["states"]),
            "partitions": [None if pid not in by_pid else {"keys": by_pid[pid]["keys"], "bytes": by_pid[pid]["bytes"]}
                           for pid in range(partitions)]}


def events_document(events: list[dict], types: set[str] | None, limit: int) -> dict:
    """The last ``limit`` of ``events`` of the ``types`` (None: every type), oldest first, and how many of each type
    ``events`` holds (the page's filter offers those)."""
    counts: dict[str, int] = {}
    for e in events:
        counts[e["event"]] = counts.get(e["event"], 0) + 1
    chosen = events if types is None else [e for e in events if e["event"] in types]
    return {"types": dict(sorted(counts.items())), "events": chosen[-limit:]}


def _moves(events: list[dict]) -> list[dict]:
    """Moves in flight: started, neither finished nor failed (as far as the recent events tell)."""
    moving: dict[int, dict] = {}
    for e in events:
        if e["event"] == "migration_started":
            moving[e["partition"]] = {"partition": e["partition"], "source": e["source"], "target": e["target"], "since": e["time"]}
        elif e["event"] in MOVES:
            moving.pop(e["partition"], None)
    return sorted(moving.values(), key=lambda m: m["partition"])


def cluster_status(status: dict, figures: dict[str, dict | None], events: list[dict], *, states: int, sizes: dict | None,
                   coordinators: dict, failovers: Iterable[str], backup_count: int, replication: str, replicas: list[dict],
                   pipelines: Iterable[dict], checkpoints: dict | None) -> dict:
    """The document, from what the coordinator read for it: ``status`` its ``table_status``, ``events`` the recent
    ones (moves in flight are told from them), ``sizes`` the states' and partitions' (``sizes()``; None: not asked
    yet), ``checkpoints`` the storage's url, latest and history (None: none)."""
    for node in status["nodes"]:
        answer = figures.get(node["node_id"])
        node["figures"] = None if answer is None else {k: v for k, v in answer.items() if k != "load"}  # load: /api/load
    return {
        **status,
        "states": states,
        "sizes": sizes,
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
