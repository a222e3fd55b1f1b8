"""The coordinator's catalog of states and its cluster-wide answers, put together from the nodes' and its own.

``ClusterAnswers`` is the part of ``Coordinator`` that serves them (its
handlers ``define_state``, ``count``, ``cluster_stats``, ``status`` (the document of web/status.py),
``events_after``, ``pipeline_progress``); the functions below it only compute.
"""

from __future__ import annotations

from typing import Iterable

from ...store import StateSpec
from ...store.catalog import unknown_state
from .web.status import cluster_status
from .. import protocol as p


class ClusterAnswers:
    """The coordinator's handlers for the catalog and cluster-wide questions (a part of ``Coordinator``, which has
    the state they read: ``specs``, ``table``, ``membership``, ``peers``, ``events``, ``pipelines``, ``checkpoints``,
    and ``define_lock``)."""

    async def define_state(self, msg: p.DefineState, conn) -> dict:
        return (await self.define(StateSpec.from_dict(msg.spec))).to_dict()

    async def define(self, spec: StateSpec) -> StateSpec:
        async with self.define_lock:  # a second definer answers once the first one's nodes know the state
            existing = self.specs.get(spec.name)
            if existing is not None:
                existing.check_same(spec)
                return existing
            self.specs[spec.name] = spec
            await self._save()
            await self._broadcast(p.NodeDefineState(spec=spec.to_dict()))
            return spec

    async def count(self, msg: p.Count, conn) -> int:
        if msg.state not in self.specs:
            raise unknown_state(msg.state)
        self.partitions_by_node()  # refuses (retryable) while a partition has no live owner: a partial count would look whole
        return sum(n for _, n in await self.peers.ask_all(self.membership.alive(), p.NodeCount(state=msg.state)))

    async def cluster_stats(self, msg: p.ClusterStats, conn) -> dict:
        self.partitions_by_node()  # as count()
        return merge_stats(self.specs, [(peer.node_id, answer) for peer, answer in await self.peers.ask_all(self.membership.alive(), p.NodeStats())])

    async def pipeline_progress(self, msg: p.PipelineProgress, conn) -> None:
        self.pipelines[msg.record["query"]] = {**msg.record, "batches": msg.record.get("batches", [])[-5:]}
        self.metrics.pipeline(msg.record)
        await self._save()

    async def status(self, msg: p.Status, conn) -> dict:
        return await cluster_status(self)

    async def events_after(self, msg: p.Events, conn) -> list:
        return await self.events.wait_after(msg.after, msg.wait)



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
