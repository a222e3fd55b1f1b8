"""The cluster's checkpoints and savepoints, as a client asks the coordinator for them."""

from __future__ import annotations

from typing import Any, Callable

from ...checkpoint.coordinator import CheckpointRecord
from ...checkpoint.restore import RestoreResult
from ...checkpoint.savepoint import SavepointInfo
from .. import protocol as p
from ..leader_channel import CoordinatorChannel


class ClusterCheckpointClient:
    """The cluster's checkpoints, as ``Rockstate.checkpoint()`` and friends see them."""

    TIMEOUT = 3600.0

    def __init__(self, coordinator: CoordinatorChannel, ask: Callable[..., Any]) -> None:
        self._coordinator = coordinator  # restores and savepoints are not retried: they are not idempotent
        self._ask = ask
        self.last_restore: RestoreResult | None = None

    def checkpoint(self) -> CheckpointRecord:
        return CheckpointRecord(**self._ask(p.TriggerCheckpoint(), timeout=self.TIMEOUT))

    def checkpoints(self) -> list[CheckpointRecord]:
        return [CheckpointRecord(**r) for r in self._ask(p.ListCheckpoints())]

    def restore(self, checkpoint_id: int | None = None, savepoint: str | None = None) -> RestoreResult:
        r = self._coordinator.call(p.RestoreCluster(checkpoint=checkpoint_id, savepoint=savepoint), timeout=self.TIMEOUT)
        self.last_restore = RestoreResult.from_dict(r)
        return self.last_restore

    def savepoint(self, name: str, checkpoint_id: int | None = None) -> SavepointInfo:
        return SavepointInfo(**self._coordinator.call(p.CreateSavepoint(name=name, checkpoint=checkpoint_id), timeout=self.TIMEOUT))

    def inspect(self, checkpoint_id: int) -> dict:
        return self._ask(p.InspectCheckpoint(checkpoint=checkpoint_id))

    def savepoints(self) -> list[SavepointInfo]:
        return [SavepointInfo(**s) for s in self._ask(p.ListSavepoints())]
