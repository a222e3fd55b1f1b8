"""The coordinator's checkpoint driver: carries out what the checkpoint state machine decides.

A checkpoint sends barrier N to every node with the partitions it owns,
collects one manifest per partition, writes ``chk-N/_metadata`` (the commit
point), tells the nodes, and collects garbage. Partitions do not move while a
checkpoint, restore or savepoint runs (they hold the coordinator's table
lock), so each partition's barrier reaches exactly its one owner.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from ..checkpoint.actions import collect_garbage, load_coordinator, remove_aborted, write_metadata
from ..checkpoint.coordinator import Aborted, CheckpointCoordinator, CheckpointPolicy, Trigger, WriteMetadata
from ..checkpoint.restore import SkippedCheckpoint, candidates, load_metadata
from ..checkpoint.savepoint import create_savepoint, list_savepoints, read_savepoint
from ..checkpoint.storage import CheckpointStorage
from ..config import CheckpointConfig
from ..errors import (CheckpointAbortedError, CheckpointError, CheckpointNotFoundError, CheckpointStorageError,
                      CorruptCheckpointError, RockstateError)
from ..retry import Retry
from ..store import StateSpec
from . import protocol as p

if TYPE_CHECKING:
    from .coordinator import Coordinator

log = logging.getLogger(__name__)

STORAGE_RETRY = Retry(deadline=15.0, initial=0.2, maximum=8.0)


class ClusterCheckpoints:
    def __init__(self, coordinator: "Coordinator", config: CheckpointConfig) -> None:
        self.coordinator = coordinator
        self.config = config
        self.storage = CheckpointStorage(config.url, config.storage_options, config.cluster, config.transfer_threads)
        self.policy = CheckpointPolicy(config.retained, config.interval, config.timeout, config.min_pause, config.tolerable_failures)
        self.machine: CheckpointCoordinator | None = None  # read from the storage by ``open``
        self.last_restore: dict | None = None

    async def open(self) -> None:
        """Read what the storage holds; a failing storage is retried for a while (a crash loop helps nobody)."""
        def load() -> CheckpointCoordinator:
            try:
                return load_coordinator(self.storage, self.coordinator.table.partitions, self.policy)
            except CheckpointStorageError as exc:
                log.warning("reading the checkpoints in %s failed (%s); retrying", self.storage.url, exc)
                raise

        self.machine = await STORAGE_RETRY.acall(asyncio.to_thread, load)

    def latest(self) -> int | None:
        return self.machine.latest_completed

    # -- checkpoints -------------------------------------------------------------

    async def checkpoint(self, manual: bool = True) -> dict:
        async with self.coordinator.table_lock:
            by_node = self.coordinator.partitions_by_node()  # first: a partition without a live owner begins nothing
            states = {name: spec.to_dict() for name, spec in self.coordinator.specs.items()}
            return await self._run(self.machine.trigger(time.time(), manual=manual, states=states), by_node)

    async def _run(self, trigger: Trigger, by_node) -> dict:
        chk = trigger.checkpoint_id
        calls = [member.rpc(self.coordinator.security).call(
            p.SnapshotPartitions(checkpoint=chk, retained=list(trigger.retained), partitions=pids), timeout=self.config.timeout)
            for member, pids in by_node]
        try:
            answers = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), self.config.timeout)
        except TimeoutError:
            answers = []
        action = None
        for (member, pids), answer in zip(by_node, answers):
            if isinstance(answer, BaseException):
                return await self._abort(self.machine.decline(chk, pids[0], f"node {member.node_id}: {answer}", time.time()), by_node)
            for manifest in answer:
                action = self.machine.ack(chk, manifest, time.time()) or action
        if not isinstance(action, WriteMetadata):
            return await self._abort(self.machine.timeouts(time.time() + self.config.timeout + 1), by_node)
        try:
            await asyncio.to_thread(write_metadata, self.storage, action)
        except Exception as exc:  # noqa: BLE001 -- any storage failure aborts the checkpoint
            return await self._abort(self.machine.fail(chk, f"writing _metadata failed: {exc}", time.time()), by_node)
        done = self.machine.metadata_written(chk, time.time())
        await self._tell(by_node, chk, completed=True)
        await asyncio.to_thread(collect_garbage, self.storage, done, self.machine, self.config.sweep)
        self.coordinator.event("checkpoint_completed", checkpoint=chk, seconds=round(done.record.duration or 0, 4),
                               bytes_uploaded=done.record.uploaded_bytes)
        return done.record.to_dict()

    async def _tell(self, by_node, chk: int, completed: bool) -> None:
        await asyncio.gather(*(member.rpc(self.coordinator.security).call(
            p.FinishCheckpoint(checkpoint=chk, completed=completed, partitions=pids)) for member, pids in by_node),
            return_exceptions=True)

    async def _abort(self, aborted: Aborted | None, by_node) -> dict:
        if aborted is None:
            raise CheckpointError("the checkpoint is no longer in flight")
        chk = aborted.record.checkpoint_id
        await self._tell(by_node, chk, completed=False)
        await asyncio.to_thread(remove_aborted, self.storage, aborted)
        self.coordinator.event("checkpoint_aborted", checkpoint=chk, reason=aborted.record.failure)
        raise CheckpointAbortedError(f"checkpoint {chk} aborted: {aborted.record.failure}", checkpoint_id=chk,
                                     consecutive_failures=self.machine.consecutive_failures)

    async def inspect(self, checkpoint_id: int) -> dict:
        meta = await asyncio.to_thread(load_metadata, self.storage, checkpoint_id)
        return meta.to_dict()

    def history(self) -> list[dict]:
        return [r.to_dict() for r in self.machine.history()]

    async def periodic(self) -> None:
        """Trigger checkpoints every ``interval`` seconds (a task of the coordinator)."""
        while True:
            due = self.machine.next_wakeup()
            await asyncio.sleep(1.0 if due is None else min(1.0, max(0.0, due - time.time())))
            if self.machine.consecutive_failures > self.config.tolerable_failures:
                continue  # reported in the history and events; a manual checkpoint resets it
            if self.machine.next_periodic() is not None and self.machine.next_periodic() <= time.time():
                try:
                    await self.checkpoint(manual=False)
                except RockstateError as exc:
                    log.warning("periodic checkpoint failed: %s", exc)

    # -- restore and savepoints -----------------------------------------------------

    async def restore(self, checkpoint_id: int | None = None, savepoint: str | None = None) -> dict:
        """Every partition back to a checkpoint, falling back to older ones when files are corrupt or missing."""
        async with self.coordinator.table_lock:
            if savepoint is not None:
                info, _, base = await asyncio.to_thread(read_savepoint, self.storage, savepoint)
                ids, fallback = [info.checkpoint_id], False
            else:
                ids, base, fallback = await asyncio.to_thread(candidates, self.storage, checkpoint_id), "", True
            skipped: list[SkippedCheckpoint] = []
            for chk in ids:
                try:
                    stats = await self.restore_partitions(chk, self.coordinator.partitions_by_node(), base)
                except CorruptCheckpointError as exc:
                    if not fallback:
                        raise
                    skipped.append(SkippedCheckpoint(chk, str(exc)))
                    self.coordinator.event("checkpoint_skipped", checkpoint=chk, reason=str(exc))
                    continue
                result = {"checkpoint_id": chk, "source": f"savepoint {savepoint}" if savepoint else "checkpoint",
                          "skipped": [s.__dict__ for s in skipped], "partitions": stats}
                self.last_restore = result
                self.coordinator.event("cluster_restored", checkpoint=chk, skipped=[s.checkpoint_id for s in skipped])
                return result
            raise CheckpointNotFoundError(f"no usable checkpoint to restore (skipped: {[s.__dict__ for s in skipped]})")

    async def restore_partitions(self, chk: int, by_node, base: str = "") -> list[dict]:
        await self._adopt_states(chk, base)
        answers = await asyncio.gather(*(member.rpc(self.coordinator.security).call(
            p.RestorePartitions(checkpoint=chk, partitions=pids, base=base), timeout=self.config.timeout)
            for member, pids in by_node), return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
        return [s for answer in answers for s in answer]

    async def _adopt_states(self, chk: int, base: str) -> None:
        """The checkpoint's states join the catalog (a new cluster starting from a storage knows none)."""
        meta = await asyncio.to_thread(load_metadata, self.storage, chk, base)
        for spec in meta.states.values():
            await self.coordinator.define(StateSpec.from_dict(spec))

    async def savepoint(self, name: str, checkpoint_id: int | None = None) -> dict:
        if checkpoint_id is None:
            checkpoint_id = (await self.checkpoint())["checkpoint_id"]
        info = await asyncio.to_thread(create_savepoint, self.storage, name, checkpoint_id)
        self.coordinator.event("savepoint_created", name=name, checkpoint=checkpoint_id)
        return info.to_dict()

    async def savepoints(self) -> list[dict]:
        return [s.to_dict() for s in await asyncio.to_thread(list_savepoints, self.storage)]
