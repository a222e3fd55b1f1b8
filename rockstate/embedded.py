"""Embedded mode: every partition in this process, no network."""

from __future__ import annotations

import os
from typing import Any

from .api import Rockstate
from .config import CheckpointConfig, StoreConfig, load, validate
from .errors import RockstateError
from .files import read_json
from .ops import run_groups
from .runs import get_many_as_runs
from .store import StateSpec, Store


class EmbeddedBackend:
    """Serves the state handles straight from a local ``Store``.

    ``checkpointer`` (a ``LocalCheckpointer``, or None without checkpoint
    storage) takes, lists and restores checkpoints and savepoints.
    """

    def __init__(self, store: Store, checkpointer=None) -> None:
        self.store = store
        self.checkpointer = checkpointer
        self.partitions = store.partitions
        self.max_key_bytes = store.config.max_key_bytes
        self.max_value_bytes = store.config.max_value_bytes

    def define_state(self, spec: StateSpec, create: bool = True) -> StateSpec:
        return self.store.define_state(spec, create)

    def write(self, ops_by_pid):
        self.store.write_all(list(ops_by_pid.items()))

    def write_runs(self, op, state, pids, counts, keys, values):
        self.store.write_all(run_groups(op, state, pids, counts, keys, values))

    def get_many(self, state, keys_by_pid):
        return get_many_as_runs(self.read_runs, state, keys_by_pid)

    def read_runs(self, state, pids, counts, keys):
        return self.store.get_runs(state, pids, counts, keys)

    def compare_and_set(self, state, pid, key, expected, new) -> bool:
        return self.store.partition(pid).compare_and_set(state, key, expected, new)

    def scan(self, state, pid, prefix, after, limit):
        return self.store.scan(pid, state, prefix, after, limit)

    def scan_many(self, state, pages_by_pid):
        return {pid: self.store.scan_columns(pid, state, prefix, after, limit, stop)
                for pid, (prefix, after, stop, limit) in pages_by_pid.items()}

    def count(self, state: str) -> int:
        return sum(self.store.partition(pid).count(state)[0] for pid in self.store.owned())

    def stats(self) -> dict:
        return self.store.stats()

    def subscribe(self, callback) -> None:
        raise RockstateError("events come from a cluster: use rockstate.connect(...)")

    def close(self) -> None:
        try:
            if self.checkpointer is not None:
                self.checkpointer.close()
        finally:
            self.store.close()


def open(
    path: str,
    partitions: int | None = None,
    *,
    config: str | None = None,
    checkpoints: str | CheckpointConfig | None = None,
    storage_options: dict[str, Any] | None = None,
    retained_checkpoints: int | None = None,
    checkpoint_interval: float | None = None,
    cluster: str | None = None,
    restore_from: int | str | None = None,
    **settings,
) -> Rockstate:
    """Open (or create) an embedded store at ``path``.

    ``partitions``: P of a new store (default 271); an existing store keeps its own (given, it must match).
    ``settings`` are ``StoreConfig`` fields (memory_bytes, max_value_bytes, ...);
    ``config`` a YAML file of them.

    Checkpoints: ``checkpoints`` is the storage URL (``file:///dir``,
    ``s3://bucket/prefix``, ...) or a full ``CheckpointConfig``;
    ``storage_options`` go to the filesystem (S3 otherwise takes the standard
    AWS environment variables); ``retained_checkpoints`` (default 3),
    ``checkpoint_interval`` (seconds; default: manual only) and ``cluster``
    (the folder under the URL, default "default") override the config's.
    ``restore_from`` starts from a checkpoint id (int) or a savepoint name
    (str). Without it, a store with no partition data on disk restores the
    latest completed checkpoint the storage holds, if any; see
    ``Rockstate.restored``.
    """
    if partitions is None:  # an existing store's own count (it was fixed at its creation)
        meta = read_json(os.path.join(path, "STORE.json"))
        partitions = meta.get("partitions") if isinstance(meta, dict) else None
    cfg = load(StoreConfig, config, partitions=partitions, **settings)
    ckpt_cfg = _checkpoint_config(checkpoints, storage_options, retained_checkpoints, checkpoint_interval, cluster)
    if ckpt_cfg is None and restore_from is not None:
        from .errors import CheckpointsNotConfiguredError

        raise CheckpointsNotConfiguredError("restore_from needs checkpoint storage: pass checkpoints=URL")
    fresh = not _has_partition_data(path)
    # A store that may be restored right away opens no partition yet: the checkpointer opens them after.
    store = Store(path, cfg, owned=[] if ckpt_cfg is not None else None)
    checkpointer = None
    if ckpt_cfg is not None:
        from .checkpoint.local import open_checkpointer

        try:
            checkpointer = open_checkpointer(store, ckpt_cfg, restore_from, fresh)
        except BaseException:
            store.close()
            raise
    return Rockstate(EmbeddedBackend(store, checkpointer))


def _checkpoint_config(checkpoints, storage_options, retained, interval, cluster) -> CheckpointConfig | None:
    if checkpoints is None:
        return None
    base = checkpoints.model_dump() if isinstance(checkpoints, CheckpointConfig) else {"url": checkpoints}
    overrides = {"storage_options": storage_options, "retained": retained, "interval": interval, "cluster": cluster}
    base.update({k: v for k, v in overrides.items() if v is not None})
    return validate(CheckpointConfig, base)


def _has_partition_data(path: str) -> bool:
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return False
    return any((n == "db" or n.startswith("p")) and os.path.exists(os.path.join(path, n, "CURRENT")) for n in names)
