"""Checkpoints of an embedded store: the checkpoint driver with the store's own partitions as its one participant.

``LocalCheckpointer`` gives the driver (``driver.py``) a synchronous face: it
runs on an event loop in a thread of its own, where ``interval`` also runs the
periodic schedule. One checkpoint, restore or savepoint runs at a time.

A checkpoint is a per-partition cut, as in the cluster: a batch written to one
partition is in it entirely or not at all; a batch spanning partitions is
applied partition by partition, so it may be in a checkpoint for some of them.
A restore swaps the partitions in only once every one of them is restored, so
a failed restore leaves the store as it was.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import Future
from typing import Any, Coroutine, TypeVar

from ..config import CheckpointConfig
from ..errors import CheckpointError
from ..store import Store
from ..store.catalog import check_name
from .coordinator import CheckpointRecord
from .driver import CheckpointDriver, policy_of
from .participants import LocalPartitions
from .restore import RestoreResult
from .savepoint import SavepointInfo
from .storage import CheckpointStorage

log = logging.getLogger(__name__)

T = TypeVar("T")


class LocalCheckpointer:
    """Checkpoints, restores and savepoints of every partition of ``store``."""

    def __init__(self, store: Store, config: CheckpointConfig) -> None:
        if not config.url:
            raise CheckpointError("CheckpointConfig.url is not set")
        check_name(config.cluster, "cluster")
        self.store, self.config = store, config
        self.storage = CheckpointStorage.of(config)
        self.local = LocalPartitions(store, config, self.storage)
        self.snapshotter = self.local.snapshotter
        every = list(range(store.partitions))  # embedded: the store holds every partition
        self.driver = CheckpointDriver(self.storage, store.partitions, policy_of(config), lambda: [(self.local, every)],
                                       sweep=config.sweep, specs=lambda: store.specs)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rockstate-checkpoints", daemon=True)
        self._thread.start()
        self._periodic: Future | None = None
        try:
            self._run(self.driver.open())
        except BaseException:
            self.close()
            raise

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @property
    def last_restore(self) -> RestoreResult | None:
        return self.driver.last_restore

    def start(self) -> None:
        """Start periodic checkpoints (when ``interval`` is set), once every partition is open."""
        if self.config.interval is not None and self._periodic is None:
            self._periodic = asyncio.run_coroutine_threadsafe(self.driver.periodic(), self._loop)

    def checkpoint(self) -> CheckpointRecord:
        """Take a checkpoint of every partition now and wait for it; raises CheckpointAbortedError if it fails."""
        return self._run(self.driver.checkpoint())

    def checkpoints(self) -> list[CheckpointRecord]:
        return self.driver.history()

    def restore(self, checkpoint_id: int | None = None, savepoint: str | None = None, fallback: bool = True) -> RestoreResult:
        """Roll every partition back to a completed checkpoint (the latest by default) or a savepoint (see the driver)."""
        return self._run(self.driver.restore(checkpoint_id, savepoint, fallback))

    def savepoint(self, name: str, checkpoint_id: int | None = None) -> SavepointInfo:
        """Copy a completed checkpoint (a new one by default) to ``savepoints/<name>`` by server-side copy."""
        return self._run(self.driver.savepoint(name, checkpoint_id))

    def savepoints(self) -> list[SavepointInfo]:
        return self._run(self.driver.savepoints())

    def close(self) -> None:
        try:
            if self._periodic is not None:
                self._periodic.cancel()
            if self.driver.machine is not None:
                self._run(self.driver.idle())  # a checkpoint in flight finishes first
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()
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
        elif fresh and ckpt.driver.latest() is not None:
            ckpt.restore()
            log.info("restored checkpoint %s from %s into the new store at %s", ckpt.last_restore.checkpoint_id, config.url, store.path)
        for pid in range(store.partitions):  # the store may have been opened with none (see rockstate.open)
            store.open_partition(pid)
        ckpt.start()
    except BaseException:
        ckpt.close()
        raise
    return ckpt

