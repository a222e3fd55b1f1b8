"""What the coordinator keeps: its record (``persistence.py``) and the event log kept with it.

One ``ClusterState`` lives as long as the coordinator; ``take_up`` replaces its
contents with a saved record (at start, and each time it is elected), so every
part given it reads the record loaded last. The replica sets are a section of
the record too, kept by ``replication/in_sync.py``'s ``ReplicaControl``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from ...config import CheckpointConfig, CoordinatorConfig
from ...control.membership import Member, Membership, MemberStatus
from ...store import StateSpec
from .events import EventLog
from ..table import Table


def checkpoint_config(config: CoordinatorConfig) -> CheckpointConfig | None:
    """The cluster's checkpoints (a node gets them at registration); None without a storage URL."""
    return config.checkpoints if config.checkpoints and config.checkpoints.url else None


def limits(config: CoordinatorConfig) -> dict:
    """The size limits every node and client checks (with the table, and at registration)."""
    return {"max_key_bytes": config.max_key_bytes, "max_value_bytes": config.max_value_bytes}


def node_settings(config: CoordinatorConfig) -> dict:
    """The coordinator's settings a node takes only when it registers (its lease is half the heartbeat timeout):
    changed, they need every node restarted (``Membership.needs_restart``; docs/operations.md lists them)."""
    return {**limits(config), "heartbeat_timeout": config.heartbeat_timeout}


@dataclass
class ClusterState:
    table: Table
    events: EventLog
    specs: dict[str, StateSpec] = field(default_factory=dict)
    membership: Membership = field(default_factory=lambda: Membership(0.0))
    pipelines: dict[str, dict] = field(default_factory=dict)
    failovers: set[str] = field(default_factory=set)  # dead nodes whose partitions are not restored yet
    sent_epoch: int = 0  # of the last table sent to the nodes (by this process)
    _sent: asyncio.Event = field(default_factory=asyncio.Event, repr=False)  # set (and replaced) as a table is sent

    def table_sent(self, epoch: int) -> None:
        """A table reached the nodes: a client waiting for a newer one (``newer_table``) takes it now."""
        self.sent_epoch = max(self.sent_epoch, epoch)
        self._sent.set()
        self._sent = asyncio.Event()

    async def newer_table(self, epoch: int, wait: float) -> bool:
        """Whether the table is newer than ``epoch``, once the nodes have one newer than it (so that a client
        does not try owners that do not know they are yet) or after ``wait`` seconds."""
        deadline = time.monotonic() + wait
        while self.sent_epoch <= epoch and (left := deadline - time.monotonic()) > 0:
            try:
                await asyncio.wait_for(self._sent.wait(), left)
            except TimeoutError:
                break
        return self.table.epoch > epoch

    def take_up(self, config: CoordinatorConfig, saved: dict, events: EventLog) -> None:
        """A saved record ({}: a new cluster), with the event log kept beside it."""
        self.table = Table.from_wire(saved["table"]) if saved else Table.empty(config.partitions)
        self.sent_epoch = self.table.epoch  # the record's table went to the nodes as it was saved (or is sent again)
        self.specs = {d["name"]: StateSpec.from_dict(d) for d in saved.get("states", [])}
        # a restarted coordinator, or a new leader, gives every node a full timeout to check in
        self.membership = Membership.from_wire(config.heartbeat_timeout, saved, time.monotonic())
        self.pipelines = saved.get("pipelines", {})
        self.failovers = set(saved.get("failovers", []))
        self.events = events

    def record(self) -> dict:
        """The sections the coordinator keeps itself (the replica sets add theirs)."""
        return {
            "table": self.table.to_wire(),
            "states": [s.to_dict() for s in self.specs.values()],
            **self.membership.to_wire(),
            "pipelines": self.pipelines,
            "failovers": sorted(self.failovers),
        }

    def member(self, node_id: str) -> Member:
        return self.membership[node_id]

    def statuses(self) -> dict[str, MemberStatus]:
        return self.membership.statuses()
