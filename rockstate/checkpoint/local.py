"""Checkpoints of an embedded store: the driver that does the I/O for the state machine.

``LocalCheckpointer`` owns the storage, the snapshotter and a
``CheckpointCoordinator``, and runs each checkpoint in this process: the sync
phase of every partition (one after the other; each partition's writes pause
only for its own), then the async phases in parallel, the acks, ``_metadata``,
then garbage collection. One checkpoint, restore or savepoint runs at a time;
``interval`` adds a background thread that triggers periodic checkpoints.

A checkpoint is a per-partition cut, as in the cluster: a batch written to one
partition is in it entirely or not at all; a batch spanning partitions is
applied partition by partition, so it may be in a checkpoint for some of them.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait

from ..config import CheckpointConfig
from ..errors import CheckpointAbortedError, CheckpointError, PartitionCountError, SavepointExistsError
from ..store import StateSpec, Store
from ..store.catalog import check_name
from ..store.store import partition_dir, write_json
from .actions import collect_garbage, load_coordinator, remove_aborted, write_metadata
from .coordinator import Aborted, CheckpointCoordinator, CheckpointPolicy, CheckpointRecord, Trigger, WriteMetadata
from .manifest import PartitionManifest
from .restore import PartitionTarget, RestoreResult, candidates, load_manifests, restore_partitions, restore_with_fallback
from .savepoint import MARKER, SavepointInfo, create_savepoint, list_savepoints, read_savepoint
from .snapshot import Snapshotter
from .storage import CheckpointStorage, join, savepoint_dir

log = logging.getLogger(__name__)


class LocalCheckpointer:
    """Checkpoints, restores and savepoints of every partition of ``store``."""

    def __init__(self, store: Store, config: CheckpointConfig) -> None:
        if not config.url:
            raise CheckpointError("CheckpointConfig.url is not set")
        check_name(config.cluster, "cluster")
        self.store, self.config = store, config
        self.storage = CheckpointStorage(config.url, config.storage_options, config.cluster, config.transfer_threads)
        self.snapshotter = Snapshotter(self.storage, os.path.join(store.path, "checkpoints"), config.local_snapshots)
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="rockstate-snapshot")
        self._lock = threading.RLock()
        self.last_restore: RestoreResult | None = None
        self.coordinator = self._load_coordinator()
        self._stop = threading.Event()
        self._periodic: threading.Thread | None = None

    def start(self) -> None:
        """Start periodic checkpoints (when ``interval`` is set), once every partition is open."""
        if self.config.interval is not None and self._periodic is None:
            self._periodic = threading.Thread(target=self._periodic_loop, name="rockstate-checkpoints", daemon=True)
            self._periodic.start()

    @property
    def policy(self) -> CheckpointPolicy:
        c = self.config
        return CheckpointPolicy(c.retained, c.interval, c.timeout, c.min_pause, c.tolerable_failures)

    def _load_coordinator(self) -> CheckpointCoordinator:
        return load_coordinator(self.storage, self.store.partitions, self.policy)

    # -- checkpoints -------------------------------------------------------------

    def checkpoint(self) -> CheckpointRecord:
        """Take a checkpoint of every partition now and wait for it; raises CheckpointAbortedError if it fails."""
        with self._lock:
            return self._run(self.coordinator.trigger(time.time(), manual=True, states=self._catalog()))

    def checkpoints(self) -> list[CheckpointRecord]:
        return self.coordinator.history()

    def _catalog(self) -> dict:
        return {name: spec.to_dict() for name, spec in self.store.specs.items()}

    def _run(self, trigger: Trigger) -> CheckpointRecord:
        chk, deadline = trigger.checkpoint_id, time.time() + self.policy.timeout
        pids, cancel = list(range(self.store.partitions)), threading.Event()
        try:
            snaps = [self.snapshotter.sync_phase(self.store.partition(pid), chk) for pid in pids]
            futures = {self._pool.submit(self.snapshotter.async_phase, s, trigger.retained, cancel): s.partition for s in snaps}
            wait(futures, timeout=max(0.0, deadline - time.time()))
            for future, pid in futures.items():
                if not future.done():
                    continue
                if future.exception() is not None:
                    cancel.set()
                    exc = future.exception()
                    self._aborted(self.coordinator.decline(chk, pid, f"{type(exc).__name__}: {exc}", time.time()), pids, exc)
                action = self.coordinator.ack(chk, future.result(), time.time())
                if isinstance(action, WriteMetadata):
                    return self._complete(action, pids)
            cancel.set()
            self._aborted(self.coordinator.timeouts(max(time.time(), deadline)), pids, None)
        except CheckpointAbortedError:
            raise
        except Exception as exc:
            cancel.set()
            self._aborted(self.coordinator.fail(chk, f"{type(exc).__name__}: {exc}", time.time()), pids, exc)
        raise AssertionError("unreachable")  # every path above returns or raises

    def _complete(self, action: WriteMetadata, pids: list[int]) -> CheckpointRecord:
        chk = action.checkpoint_id
        try:
            write_metadata(self.storage, action)
        except Exception as exc:
            self._aborted(self.coordinator.fail(chk, f"writing _metadata failed: {exc}", time.time()), pids, exc)
        done = self.coordinator.metadata_written(chk, time.time())
        for pid in pids:
            self.snapshotter.confirm(pid, chk)
        collect_garbage(self.storage, done, self.coordinator, self.config.sweep)
        return done.record

    def _aborted(self, aborted: Aborted | None, pids: list[int], cause: BaseException | None) -> None:
        """Remove what the aborted checkpoint left, then raise CheckpointAbortedError."""
        if aborted is None:
            raise CheckpointError("checkpoint state lost") from cause
        chk = aborted.record.checkpoint_id
        for pid in pids:
            self.snapshotter.abort(pid, chk)
        remove_aborted(self.storage, aborted)
        if aborted.failures_exceeded:
            log.error("%d consecutive checkpoints failed (tolerable: %d)", self.coordinator.consecutive_failures, self.policy.tolerable_failures)
        raise CheckpointAbortedError(
            f"checkpoint {chk} aborted: {aborted.record.failure}",
            checkpoint_id=chk,
            consecutive_failures=self.coordinator.consecutive_failures,
        ) from cause

    def _periodic_loop(self) -> None:
        while True:
            due = self.coordinator.next_wakeup()
            if self._stop.wait(1.0 if due is None else min(1.0, max(0.0, due - time.time()))):
                return
            with self._lock:
                if self.coordinator.consecutive_failures > self.policy.tolerable_failures:
                    continue  # reported already; a manual checkpoint resets it when it succeeds
                for action in self.coordinator.tick(time.time()):
                    if isinstance(action, Trigger):
                        try:
                            self._run(action)
                        except CheckpointError as exc:
                            log.warning("periodic checkpoint failed: %s", exc)

    # -- restore -----------------------------------------------------------------

    def restore(self, checkpoint_id: int | None = None, savepoint: str | None = None, fallback: bool = True) -> RestoreResult:
        """Roll every partition back to a completed checkpoint (the latest by default) or a savepoint.

        A corrupt or missing file makes it fall back to the previous completed
        checkpoint (not for a savepoint); the result's ``skipped`` says which
        were skipped and why. The partitions are swapped only once every one of
        them is restored, so a failed restore leaves the store as it was.
        """
        with self._lock:
            start = time.perf_counter()
            if savepoint is not None:
                info, _, base = read_savepoint(self.storage, savepoint)
                ids, fallback, source = [info.checkpoint_id], False, f"savepoint {savepoint}"
            else:
                ids, base, source = candidates(self.storage, checkpoint_id), "", "checkpoint"
            staging = os.path.join(self.store.path, "restoring")
            pids = list(range(self.store.partitions))  # embedded: the store holds every partition

            def attempt(meta) -> tuple[dict[int, PartitionManifest], list]:
                if meta.partitions != self.store.partitions:
                    raise PartitionCountError(
                        f"checkpoint {meta.checkpoint_id} has {meta.partitions} partitions; this store has {self.store.partitions}",
                        expected=meta.partitions,
                    )
                shutil.rmtree(staging, ignore_errors=True)
                manifests = load_manifests(self.storage, meta, pids, base)
                parts = [self._target(manifests[pid], staging) for pid in pids]
                try:
                    stats = restore_partitions(self.storage, parts, base, self.config.verify_local)
                except BaseException:
                    shutil.rmtree(staging, ignore_errors=True)
                    raise
                return manifests, stats

            meta, (manifests, stats), skipped = restore_with_fallback(self.storage, attempt, ids, fallback, base)
            fetched = time.perf_counter()
            self._swap_in(staging, pids, meta.states)
            for pid in pids:
                self.snapshotter.reset(pid, manifests[pid], reference=savepoint is None)
            end = time.perf_counter()
            result = RestoreResult(meta.checkpoint_id, source, skipped, stats, end - start, fetched - start, end - fetched)
            if skipped:
                log.warning("restored checkpoint %s after skipping %s", meta.checkpoint_id, [s.checkpoint_id for s in skipped])
            self.last_restore = result
            return result

    def _target(self, manifest: PartitionManifest, staging: str) -> PartitionTarget:
        local = self.snapshotter.local_snapshots(manifest.partition)
        order = sorted(local, key=lambda c: (c != manifest.checkpoint_id, -c))  # the same checkpoint first
        return PartitionTarget(manifest, os.path.join(staging, partition_dir(manifest.partition)), tuple(local[c] for c in order))

    def _swap_in(self, staging: str, pids: list[int], states: dict) -> None:
        for pid in pids:
            self.store.close_partition(pid)
        old = os.path.join(self.store.path, "replaced")
        shutil.rmtree(old, ignore_errors=True)
        os.makedirs(old)
        for pid in pids:  # renames only: each partition directory is the old one or the restored one
            path = self.store.partition_path(pid)
            if os.path.exists(path):
                os.rename(path, os.path.join(old, partition_dir(pid)))
            os.rename(os.path.join(staging, partition_dir(pid)), path)
        shutil.rmtree(old, ignore_errors=True)
        shutil.rmtree(staging, ignore_errors=True)
        specs = self.store.specs  # shared with the partitions: update in place
        for name, data in states.items():
            specs[name] = StateSpec.from_dict(data)
        write_json(os.path.join(self.store.path, "states.json"), {n: s.to_dict() for n, s in specs.items()})
        for pid in pids:
            self.store.open_partition(pid)

    # -- savepoints ------------------------------------------------------------------

    def savepoint(self, name: str, checkpoint_id: int | None = None) -> SavepointInfo:
        """Copy a completed checkpoint (a new one by default) to ``savepoints/<name>`` by server-side copy."""
        check_name(name, "savepoint")
        with self._lock:
            if self.storage.exists(join(savepoint_dir(name), MARKER)):
                raise SavepointExistsError(f"savepoint {name!r} exists already in {self.storage.url}", name=name)
            if checkpoint_id is None:
                checkpoint_id = self.checkpoint().checkpoint_id
            return create_savepoint(self.storage, name, checkpoint_id)

    def savepoints(self) -> list[SavepointInfo]:
        return list_savepoints(self.storage)

    # -- life cycle -------------------------------------------------------------------

    def close(self) -> None:
        self._stop.set()
        if self._periodic is not None and self._periodic is not threading.current_thread():
            self._periodic.join()
        with self._lock:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self.storage.close()


def open_checkpointer(store: Store, config: CheckpointConfig, restore_from: int | str | None, fresh: bool) -> LocalCheckpointer:
    """A checkpointer for ``store``; restores ``restore_from`` (a checkpoint id or a savepoint name), or the
    latest completed checkpoint when the store is ``fresh`` (no partition data on disk) and the storage has one.

    ``store`` may have been opened with no partition open (``owned=[]``), so a
    restore does not open partitions only to replace them; every partition is
    open when this returns."""
    ckpt = LocalCheckpointer(store, config)
    try:
        if isinstance(restore_from, str):
            ckpt.restore(savepoint=restore_from)
        elif restore_from is not None:
            ckpt.restore(checkpoint_id=int(restore_from))
        elif fresh and ckpt.coordinator.latest_completed is not None:
            ckpt.restore()
            log.info("restored checkpoint %s from %s into the new store at %s", ckpt.last_restore.checkpoint_id, config.url, store.path)
        for pid in range(store.partitions):  # the store may have been opened with none (see rockstate.open)
            store.open_partition(pid)
        ckpt.start()
    except BaseException:
        ckpt.close()
        raise
    return ckpt

