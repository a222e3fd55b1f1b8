"""The coordinator's catalog of states and its cluster-wide answers, put together from the nodes' and its own.

``ClusterAnswers`` serves them (``define_state``, ``get_table``, ``count``,
``cluster_stats``, ``status`` (the document of web/status.py),
``events_after``, ``pipeline_progress``); the functions below it only compute.
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, Iterable

from ...config import CoordinatorConfig
from ...rpc.messages import Message
from ...rpc.server import Connection
from ...store import StateSpec
from ...store.catalog import unknown_state
from .checkpoints import ClusterCheckpoints
from .metrics import CoordinatorMetrics
from .peers import Peers
from .state import ClusterState, limits, node_settings
from .web.load import SAMPLE_EVERY, LoadHistory
from .web.status import FIGURES_EVERY, FIGURES_TIMEOUT, SIZES_EVERY, SIZES_SLOWER, SIZES_TIMEOUT, Asked, cluster_status, sizes, table_status
from .. import protocol as p
from ..replication.in_sync import ReplicaControl


class ClusterAnswers:
    def __init__(self, config: CoordinatorConfig, state: ClusterState, replicas: ReplicaControl, peers: Peers,
                 metrics: CoordinatorMetrics, *, checkpoints: Callable[[], ClusterCheckpoints | None],
                 owned: Callable[[], object], broadcast: Callable[[Message], Awaitable[object]],
                 save: Callable[[], Awaitable[None]], coordinators: Callable[[], Awaitable[dict]]) -> None:
        """``checkpoints()``: the cluster's, if any; ``owned()``: the live owners, refusing (retryable) while a
        partition has none; ``broadcast(msg)``: to every live member; ``save()``: the record kept;
        ``coordinators()``: the leader and the standbys."""
        self.config, self.state, self.replicas, self.peers, self.metrics = config, state, replicas, peers, metrics
        metrics.read_replicas(replicas)  # the status's replica figures are the metrics' too (one source)
        self._checkpoints, self._owned, self._broadcast = checkpoints, owned, broadcast
        self._save, self._coordinators = save, coordinators
        self.define_lock = asyncio.Lock()  # states are defined one at a time
        # shared by every reader of the status; each node's figures also feed its load history (web/load.py)
        self.load = LoadHistory()
        alive = lambda: self.state.membership.alive()  # the membership is replaced when a record is taken up
        self.figures = Asked(alive, peers.channel, p.NodeFigures, every=FIGURES_EVERY,
                             timeout=FIGURES_TIMEOUT, answered=self.load.record)
        self.sizes = Asked(alive, peers.channel, p.NodeStats, every=SIZES_EVERY, timeout=SIZES_TIMEOUT, slower=SIZES_SLOWER)

    async def sample_load(self) -> None:
        """The leader's task: the nodes' figures every SAMPLE_EVERY seconds, so the page's graphs of their load cover
        the minutes before anyone opened it. (Not their sizes: those read every entry, asked only while read.)"""
        await self.figures.keep_fresh(SAMPLE_EVERY)

    async def define_state(self, msg: p.DefineState, conn: Connection) -> dict:
        return (await self.define(StateSpec.from_dict(msg.spec), msg.create)).to_dict()

    async def define(self, spec: StateSpec, create: bool = True) -> StateSpec:
        async with self.define_lock:  # a second definer (or a look-up) answers once the first one's nodes know the state
            existing = self.state.specs.get(spec.name)
            if existing is not None:
                existing.check_same(spec)
                return existing
            if not create:
                raise unknown_state(spec.name, self.state.specs)
            self.state.specs[spec.name] = spec
            await self._save()
            await self._broadcast(p.NodeDefineState(spec=spec.to_dict()))
            return spec

    async def get_table(self, msg: p.GetTable, conn: Connection) -> dict | None:
        if msg.wait and not await self.state.newer_table(msg.newer_than, msg.wait):
            return None  # none newer: the client keeps its own
        return {**self.state.table.to_wire(), "limits": limits(self.config)}

    async def count(self, msg: p.Count, conn: Connection) -> int:
        if msg.state not in self.state.specs:
            raise unknown_state(msg.state, self.state.specs)
        self._owned()  # refuses (retryable) while a partition has no live owner: a partial count would look whole
        return sum(n for _, n in await self.peers.ask_all(self.state.membership.alive(), p.NodeCount(state=msg.state)))

    async def cluster_stats(self, msg: p.ClusterStats, conn: Connection) -> dict:
        self._owned()  # as count()
        answers = await self.peers.ask_all(self.state.membership.alive(), p.NodeStats())
        return merge_stats(self.state.specs, [(peer.node_id, answer) for peer, answer in answers])

    async def pipeline_progress(self, msg: p.PipelineProgress, conn: Connection) -> None:
        self.state.pipelines[msg.record["query"]] = {**msg.record, "batches": msg.record.get("batches", [])[-5:]}
        self.metrics.pipeline(msg.record)
        await self._save()

    async def status(self, msg: p.Status, conn: Connection) -> dict:
        return await self.document()

    async def document(self) -> dict:
        """The cluster's status (web/status.py)."""
        state = self.state
        status = table_status(state.table, state.membership.members.values(), time.monotonic())
        figures = await self.figures.get()
        events = state.events.latest(1000)
        checkpoints = self._checkpoints()
        history = checkpoints.history() if checkpoints is not None else []
        self.sizes.refresh()  # in the background: the document shows the last answers
        asked = self.sizes.by_node
        stats = None if self.sizes.at == float("-inf") else sizes(
            merge_stats(state.specs, [(n, a) for n, a in asked.items() if a is not None]), state.table.partitions,
            time.monotonic() - self.sizes.at)
        return {**cluster_status(
            status, figures, events, states=len(state.specs), sizes=stats, coordinators=await self._coordinators(),
            failovers=state.failovers, backup_count=self.config.backup_count, replication=self.config.replication,
            replicas=self.replicas.status() if self.replicas.enabled else [], pipelines=state.pipelines.values(),
            checkpoints=None if checkpoints is None else {
                "url": checkpoints.config.url, "latest": checkpoints.latest(), "history": history}),
            # nodes that took other values of the settings a node takes only at registration: to restart
            "restart": state.membership.needs_restart(node_settings(self.config))}

    def load_document(self) -> dict:
        """Each member's throughput and latency over the last minutes (web/load.py)."""
        return self.load.document(time.monotonic(), self.state.membership.members)

    async def events_after(self, msg: p.Events, conn: Connection) -> list:
        return await self.state.events.wait_after(msg.after, msg.wait)


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
