"""The checkpoint driver: carries out what the checkpoint state machine decides, with the participants.

One driver for an embedded store and for a cluster; they differ only in their
participants (``participants.py``): the store's own partitions, or each node's
over RPC. ``holders()`` says who holds which partitions now.

A checkpoint, under ``lock`` (in a cluster, the table's: partitions do not
move meanwhile): find the holders (a partition without one begins nothing),
``trigger``, send barrier N to every holder with its partitions, ``ack`` each
manifest, write ``chk-N/_metadata`` (the commit point), tell the holders, and
collect garbage. A holder failing, writing ``_metadata`` failing, or the
timeout passing aborts it: the holders hear so, and its files are removed.

A restore tries the requested (or latest) checkpoint and falls back to older
ones when files are corrupt or missing (``restore_with_fallback``); each
holder restores its partitions. Failover restores chosen partitions on chosen
holders (``restore_partitions``). Savepoints copy a completed checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable, Mapping

from ..config import CheckpointConfig
from ..errors import CheckpointAbortedError, CheckpointError, PartitionCountError, RockstateError, SavepointExistsError
from ..store.catalog import StateSpec, check_name
from .actions import collect_garbage, load_coordinator, remove_aborted, write_metadata
from .coordinator import Aborted, CheckpointCoordinator, CheckpointPolicy, CheckpointRecord, Trigger, WriteMetadata
from .manifest import CheckpointMetadata
from .participants import Holding
from .restore import PartitionRestore, RestoreResult, candidates, load_metadata, restore_with_fallback
from .savepoint import MARKER, SavepointInfo, create_savepoint, list_savepoints, read_savepoint
from .storage import CheckpointStorage, join, savepoint_dir

log = logging.getLogger(__name__)


def policy_of(config: CheckpointConfig) -> CheckpointPolicy:
    return CheckpointPolicy(config.retained, config.interval, config.timeout, config.min_pause, config.tolerable_failures)


async def _nothing(states: dict) -> None:
    return None


class CheckpointDriver:
    def __init__(
        self,
        storage: CheckpointStorage,
        partitions: int,
        policy: CheckpointPolicy,
        holders: Callable[[], list[Holding]],
        *,
        lock: asyncio.Lock | None = None,
        sweep: bool = True,
        specs: Callable[[], Mapping[str, StateSpec]] = dict,
        adopt_states: Callable[[dict], Awaitable[None]] = _nothing,
        event: Callable[..., None] = lambda event, **data: None,
    ) -> None:
        """``specs()``: the catalog a checkpoint records; ``adopt_states(states)``: a restored checkpoint's
        catalog joins the live one before its partitions are restored; ``event(event, **data)``: what happened."""
        self.storage, self.partitions, self.policy, self.holders = storage, partitions, policy, holders
        self.lock = lock or asyncio.Lock()  # one checkpoint, restore or savepoint at a time
        self.sweep, self.specs, self.adopt_states, self.event = sweep, specs, adopt_states, event
        self.machine: CheckpointCoordinator = None  # type: ignore[assignment] -- read from the storage by open()
        self.last_restore: RestoreResult | None = None

    async def open(self) -> None:
        """Continue after the checkpoints the storage holds."""
        self.machine = await asyncio.to_thread(load_coordinator, self.storage, self.partitions, self.policy)

    def latest(self) -> int | None:
        return self.machine.latest_completed

    def history(self) -> list[CheckpointRecord]:
        return self.machine.history()

    async def idle(self) -> None:
        """Wait until no checkpoint, restore or savepoint runs."""
        async with self.lock:
            pass

    # -- checkpoints -------------------------------------------------------------------

    async def checkpoint(self, manual: bool = True) -> CheckpointRecord:
        """Take a checkpoint of every partition and wait for it; raises CheckpointAbortedError if it fails."""
        async with self.lock:
            return await self._checkpoint(manual)

    async def _checkpoint(self, manual: bool) -> CheckpointRecord:
        holders = self.holders()  # first: a partition without a live holder begins nothing
        now = time.time()
        trigger = self.machine.trigger(now, manual=manual, states={n: s.to_dict() for n, s in self.specs().items()})
        try:
            return await self._run(trigger, holders, deadline=now + self.policy.timeout)
        except CheckpointAbortedError:
            raise
        except Exception as exc:  # noqa: BLE001 -- whatever went wrong, the checkpoint is aborted and cleaned up
            raise await self._aborted(self.machine.fail(trigger.checkpoint_id, f"{type(exc).__name__}: {exc}", time.time()), holders) from exc

    async def _run(self, trigger: Trigger, holders: list[Holding], deadline: float) -> CheckpointRecord:
        chk = trigger.checkpoint_id
        tasks = [asyncio.ensure_future(part.snapshot(chk, list(trigger.retained), pids)) for part, pids in holders]
        if tasks:
            await asyncio.wait(tasks, timeout=max(0.0, deadline - time.time()), return_when=asyncio.FIRST_EXCEPTION)
        action = None
        for (part, _), task in zip(holders, tasks):
            if not task.done():
                task.cancel()
            elif task.exception() is not None:
                for other in tasks:
                    other.cancel()
                exc = task.exception()
                raise await self._aborted(self.machine.fail(chk, f"{part}: {type(exc).__name__}: {exc}", time.time()), holders) from exc
            else:
                for manifest in task.result():
                    action = self.machine.ack(chk, manifest, time.time()) or action
        if not isinstance(action, WriteMetadata):  # the deadline passed before every partition acked
            raise await self._aborted(self.machine.timeouts(max(time.time(), deadline)), holders)
        try:
            await asyncio.to_thread(write_metadata, self.storage, action)
        except Exception as exc:  # noqa: BLE001 -- any storage failure aborts the checkpoint
            raise await self._aborted(self.machine.fail(chk, f"writing _metadata failed: {exc}", time.time()), holders) from exc
        done = self.machine.metadata_written(chk, time.time())
        await self._finish(holders, chk, completed=True)
        await asyncio.to_thread(collect_garbage, self.storage, done, self.machine, self.sweep)
        self.event("checkpoint_completed", checkpoint=chk, seconds=round(done.record.duration or 0, 4),
                   bytes_uploaded=done.record.uploaded_bytes)
        return done.record

    async def _finish(self, holders: list[Holding], chk: int, completed: bool) -> None:
        answers = await asyncio.gather(*(part.finish(chk, completed, pids) for part, pids in holders), return_exceptions=True)
        for (part, _), answer in zip(holders, answers):
            if isinstance(answer, BaseException):  # it learns from the next barrier's ``retained`` instead
                log.warning("telling %s that checkpoint %s %s failed: %s", part, chk, "completed" if completed else "aborted", answer)

    async def _aborted(self, aborted: Aborted | None, holders: list[Holding]) -> CheckpointError:
        """Tell the holders, remove what the aborted checkpoint left; the error to raise."""
        if aborted is None:
            return CheckpointError("the checkpoint is no longer in flight")
        chk = aborted.record.checkpoint_id
        await self._finish(holders, chk, completed=False)
        await asyncio.to_thread(remove_aborted, self.storage, aborted)
        if aborted.failures_exceeded:
            log.error("%d consecutive checkpoints failed (tolerable: %d)", self.machine.consecutive_failures, self.policy.tolerable_failures)
        self.event("checkpoint_aborted", checkpoint=chk, reason=aborted.record.failure)
        return CheckpointAbortedError(f"checkpoint {chk} aborted: {aborted.record.failure}", checkpoint_id=chk,
                                      consecutive_failures=self.machine.consecutive_failures)

    async def periodic(self) -> None:
        """Trigger a checkpoint whenever the machine says one is due (run it as a task; cancel it to stop)."""
        while True:
            due = self.machine.next_wakeup()
            await asyncio.sleep(1.0 if due is None else min(1.0, max(0.0, due - time.time())))
            if self.machine.consecutive_failures > self.policy.tolerable_failures:
                continue  # reported in the history (and events); a manual checkpoint resets it
            due = self.machine.next_periodic()
            if due is not None and due <= time.time():
                try:  # shielded: stopping the schedule lets a checkpoint in flight finish
                    await asyncio.shield(self.checkpoint(manual=False))
                except RockstateError as exc:
                    log.warning("periodic checkpoint failed: %s", exc)

    async def inspect(self, checkpoint_id: int) -> CheckpointMetadata:
        return await asyncio.to_thread(load_metadata, self.storage, checkpoint_id)

    # -- restore -------------------------------------------------------------------------

    async def restore(self, checkpoint_id: int | None = None, savepoint: str | None = None, fallback: bool = True) -> RestoreResult:
        """Every partition back to a completed checkpoint (the latest by default) or a savepoint.

        A corrupt or missing file makes it fall back to the previous completed
        checkpoint (not for a savepoint); the result's ``skipped`` says which
        were skipped and why.
        """
        async with self.lock:
            start = time.perf_counter()
            if savepoint is not None:
                info, _, base = await asyncio.to_thread(read_savepoint, self.storage, savepoint)
                ids, fallback, source = [info.checkpoint_id], False, f"savepoint {savepoint}"
            else:
                ids, base, source = await asyncio.to_thread(candidates, self.storage, checkpoint_id), "", "checkpoint"
            holders = self.holders()
            meta, stats, skipped = await restore_with_fallback(
                self.storage, lambda meta: self._restore(meta, holders, base), ids, fallback, base,
                on_skip=lambda s: self.event("checkpoint_skipped", checkpoint=s.checkpoint_id, reason=s.reason))
            seconds = time.perf_counter() - start
            fetch = max((s.seconds for s in stats), default=0.0)
            self.last_restore = RestoreResult(meta.checkpoint_id, source, skipped, stats, seconds, fetch, max(0.0, seconds - fetch))
            self.event("cluster_restored", checkpoint=meta.checkpoint_id, skipped=[s.checkpoint_id for s in skipped])
            return self.last_restore

    async def restore_partitions(self, checkpoint_id: int, holders: list[Holding], base: str = "") -> list[PartitionRestore]:
        """The holders' partitions from one checkpoint, no fallback (failover; a new cluster on a storage)."""
        return await self._restore(await asyncio.to_thread(load_metadata, self.storage, checkpoint_id, base), holders, base)

    async def _restore(self, meta: CheckpointMetadata, holders: list[Holding], base: str) -> list[PartitionRestore]:
        if meta.partitions != self.partitions:
            raise PartitionCountError(f"checkpoint {meta.checkpoint_id} has {meta.partitions} partitions; "
                                      f"this store has {self.partitions}", expected=meta.partitions)
        await self.adopt_states(meta.states)
        answers = await asyncio.gather(*(part.restore(meta.checkpoint_id, pids, base) for part, pids in holders),
                                       return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
        return [s for answer in answers for s in answer]

    # -- savepoints --------------------------------------------------------------------------

    async def savepoint(self, name: str, checkpoint_id: int | None = None) -> SavepointInfo:
        """Copy a completed checkpoint (a new one by default) to ``savepoints/<name>`` by server-side copy."""
        check_name(name, "savepoint")
        async with self.lock:  # retention does not drop the checkpoint while it is copied
            if await asyncio.to_thread(self.storage.exists, join(savepoint_dir(name), MARKER)):
                raise SavepointExistsError(f"savepoint {name!r} exists already in {self.storage.url}", name=name)
            if checkpoint_id is None:
                checkpoint_id = (await self._checkpoint(manual=True)).checkpoint_id
            info = await asyncio.to_thread(create_savepoint, self.storage, name, checkpoint_id)
        self.event("savepoint_created", name=name, checkpoint=checkpoint_id)
        return info

    async def savepoints(self) -> list[SavepointInfo]:
        return await asyncio.to_thread(list_savepoints, self.storage)
