"""Embedded mode: every partition in this process, no network."""

from __future__ import annotations

from .api import Rockstate
from .config import StoreConfig, load
from .store import StateSpec, Store


class EmbeddedBackend:
    """Serves the state handles straight from a local ``Store``."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.partitions = store.partitions
        self.max_key_bytes = store.config.max_key_bytes
        self.max_value_bytes = store.config.max_value_bytes

    def define_state(self, spec: StateSpec) -> StateSpec:
        return self.store.define_state(spec)

    def write(self, ops_by_pid):
        for pid, ops in ops_by_pid.items():
            self.store.write(pid, ops)

    def get_many(self, state, keys_by_pid):
        return {pid: self.store.get_many(pid, state, keys) for pid, keys in keys_by_pid.items()}

    def scan(self, state, pid, prefix, after, limit):
        return self.store.scan(pid, state, prefix, after, limit)

    def count(self, state: str) -> int:
        return sum(self.store.partition(pid).count(state)[0] for pid in self.store.owned())

    def stats(self) -> dict:
        return self.store.stats()

    def close(self) -> None:
        self.store.close()


def open(path: str, partitions: int = 128, *, config: str | None = None, **settings) -> Rockstate:
    """Open (or create) an embedded store at ``path``.

    ``settings`` are ``StoreConfig`` fields (memory_bytes, max_value_bytes, ...);
    ``config`` a YAML file of them.
    """
    cfg = load(StoreConfig, config, partitions=partitions, **settings)
    return Rockstate(EmbeddedBackend(Store(path, cfg)))
