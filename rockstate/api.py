"""The client API, the same in embedded mode and against a cluster."""

from __future__ import annotations

from typing import Any

from . import keys as keyhash
from .errors import CheckpointsNotConfiguredError, StoreClosedError
from .states import Backend, Checkpointer, ListState, MapState, ValueState


class Rockstate:
    """Handles to named states over a backend: an embedded store or a cluster."""

    def __init__(self, backend: Backend) -> None:
        self._backend: Backend | None = backend

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            raise StoreClosedError("this rockstate handle is closed")
        return self._backend

    @property
    def partitions(self) -> int:
        return self.backend.partitions

    # A handle defines its state only with create=True; without, a first write defines it and a read of a
    # state that does not exist raises UnknownStateError naming close matches (states.py).

    def value_state(self, name: str, ttl: float | None = None, *, create: bool = False) -> ValueState:
        return ValueState(self.backend, name, ttl, create)

    def map_state(self, name: str, ttl: float | None = None, *, create: bool = False) -> MapState:
        return MapState(self.backend, name, ttl, create)

    def list_state(self, name: str, ttl: float | None = None, *, create: bool = False) -> ListState:
        return ListState(self.backend, name, ttl, create)

    def partition_of(self, key: Any) -> int:
        return keyhash.partition_of(key, self.backend.partitions)

    def stats(self) -> dict:
        """Per state (kind, ttl, keys, bytes) and per partition (keys, bytes)."""
        return self.backend.stats()

    # -- checkpoints (embedded: rockstate.open(..., checkpoints=URL)) ------------

    def checkpoint(self):
        """Checkpoint every partition now and wait; returns its record (``id``, ``duration``, ``size``,
        ``bytes_uploaded``, ``max_pause``). Raises ``CheckpointAbortedError`` if it fails."""
        return self._checkpointer().checkpoint()

    def checkpoints(self) -> list:
        """The checkpoint history: id, state, trigger, duration, size, bytes uploaded, failure."""
        return self._checkpointer().checkpoints()

    def restore(self, checkpoint_id: int | None = None, *, savepoint: str | None = None):
        """Roll every partition back to a completed checkpoint (the latest by default) or a savepoint.

        A corrupt or missing file falls back to the previous checkpoint; the
        returned result's ``checkpoint_id`` and ``skipped`` say what happened.
        """
        return self._checkpointer().restore(checkpoint_id, savepoint=savepoint)

    def savepoint(self, name: str, checkpoint_id: int | None = None):
        """A self-contained copy of a checkpoint (a new one by default), made by server-side copy."""
        return self._checkpointer().savepoint(name, checkpoint_id)

    def savepoints(self) -> list:
        return self._checkpointer().savepoints()

    @property
    def restored(self):
        """What the latest restore restored: on opening the handle, or by ``restore()`` (None if nothing was)."""
        checkpointer = self.backend.checkpointer
        return None if checkpointer is None else checkpointer.last_restore

    def _checkpointer(self) -> Checkpointer:
        checkpointer = self.backend.checkpointer
        if checkpointer is None:
            raise CheckpointsNotConfiguredError("this store has no checkpoint storage: open it with checkpoints=URL")
        return checkpointer

    def subscribe(self, callback):
        """Call ``callback(event)`` for every cluster event (joins, leaves, deaths, moves, restores,
        checkpoints) from now on, in a background thread; returns a subscription to ``close()``."""
        return self.backend.subscribe(callback)

    def close(self) -> None:
        if self._backend is not None:
            backend, self._backend = self._backend, None
            backend.close()

    def __enter__(self) -> "Rockstate":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
