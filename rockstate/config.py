"""Typed settings, validated by pydantic, loadable from YAML and the environment.

Every field has a default; ``load(model, path=None, **overrides)`` reads a
YAML file, then ``ROCKSTATE_<FIELD>`` environment variables, then keyword
overrides, and turns validation failures into one plain ``ConfigError``.
"""

from __future__ import annotations

import os
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import ConfigError

MiB = 1024 * 1024


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StoreConfig(Settings):
    """One process's RocksDB store (embedded, or a node's partitions)."""

    partitions: int = Field(128, ge=1, le=65536, description="P: partition count, fixed at creation")
    memory_bytes: int = Field(256 * MiB, ge=8 * MiB, description="block cache + memtables of all partitions")
    max_key_bytes: int = Field(16 * MiB, ge=1, description="largest encoded key")
    max_value_bytes: int = Field(16 * MiB, ge=1, description="largest encoded value")
    ttl_sweep_interval: float = Field(60.0, gt=0, description="seconds between background removals of expired entries")
    max_open_files: int = Field(64, ge=-1, description="per partition; -1 keeps every file open")


M = TypeVar("M", bound=Settings)


def load(model: type[M], path: str | None = None, **overrides: Any) -> M:
    values: dict[str, Any] = {}
    if path:
        with open(path) as f:
            values.update(yaml.safe_load(f) or {})
    for name in model.model_fields:
        env = os.environ.get(f"ROCKSTATE_{name.upper()}")
        if env is not None:
            values[name] = env
    values.update({k: v for k, v in overrides.items() if v is not None})
    return validate(model, values)


def validate(model: type[M], values: dict[str, Any]) -> M:
    try:
        return model(**values)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']} (got {e.get('input')!r})" for e in exc.errors()
        )
        raise ConfigError(f"invalid {model.__name__}: {problems}") from None


class CoordinatorConfig(Settings):
    """The coordinator process."""

    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(7700, ge=0, le=65535, description="port to listen on (0: any free port)")
    data_dir: str = Field("./rockstate-coordinator", description="where the table, membership and catalog are kept")
    partitions: int = Field(128, ge=1, le=65536, description="P, for a new cluster; an existing one keeps its own")
    heartbeat_timeout: float = Field(5.0, gt=0, description="seconds of silence after which a node is dead")
    max_concurrent_migrations: int = Field(2, ge=1, description="partitions moving at once")
    max_key_bytes: int = Field(16 * MiB, ge=1, description="largest encoded key, for every node")
    max_value_bytes: int = Field(16 * MiB, ge=1, description="largest encoded value, for every node")
    secret_file: str | None = Field(None, description="file holding the cluster's shared secret")


class NodeConfig(Settings):
    """A node process."""

    coordinator: str = Field("127.0.0.1:7700", description="the coordinator's host:port")
    host: str = Field("127.0.0.1", description="address to listen on, and to advertise")
    port: int = Field(0, ge=0, le=65535, description="port to listen on (0: any free port)")
    data_dir: str = Field("./rockstate-node", description="the node's partitions and identity")
    memory_bytes: int = Field(256 * MiB, ge=8 * MiB, description="RocksDB block cache + memtables of all its partitions")
    heartbeat_interval: float = Field(0.5, gt=0, description="seconds between heartbeats")
    metrics_port: int | None = Field(None, ge=0, le=65535, description="Prometheus /metrics port (None: off)")
    ttl_sweep_interval: float = Field(60.0, gt=0, description="seconds between removals of expired entries")
    secret_file: str | None = Field(None, description="file holding the cluster's shared secret")
