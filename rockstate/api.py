"""The client API, the same in embedded mode and against a cluster."""

from __future__ import annotations

from typing import Any

from . import keys as keyhash
from .errors import StoreClosedError
from .states import Backend, ListState, MapState, ValueState


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

    def value_state(self, name: str, ttl: float | None = None) -> ValueState:
        return ValueState(self.backend, name, ttl)

    def map_state(self, name: str, ttl: float | None = None) -> MapState:
        return MapState(self.backend, name, ttl)

    def list_state(self, name: str, ttl: float | None = None) -> ListState:
        return ListState(self.backend, name, ttl)

    def partition_of(self, key: Any) -> int:
        return keyhash.partition_of(key, self.backend.partitions)

    def stats(self) -> dict:
        """Per state (kind, ttl, keys, bytes) and per partition (keys, bytes)."""
        return self.backend.stats()

    def close(self) -> None:
        if self._backend is not None:
            backend, self._backend = self._backend, None
            backend.close()

    def __enter__(self) -> "Rockstate":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
