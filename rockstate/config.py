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
