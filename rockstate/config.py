"""Typed settings, validated by pydantic, loadable from YAML and the environment.

Every field has a default; ``load(model, path=None, **overrides)`` reads a
YAML file, then ``ROCKSTATE_<SETTING>`` environment variables, then keyword
overrides, and turns validation failures into one plain ``ConfigError``.

A process's config nests the configs of its parts (a coordinator's
``checkpoints``, a node's ``store``, both ``security``), so each part gets its
own config whole. Operators still write flat settings (``memory_bytes``,
``checkpoint_interval``, ``secret_file``) in files, flags and the environment:
``flat`` maps each to its place, and ``settings(model)`` lists them.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.fields import FieldInfo

from .errors import ConfigError

MiB = 1024 * 1024


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # a flat setting -> (the nested config's field, the setting's name there)
    flat: ClassVar[dict[str, tuple[str, str]]] = {}

    @model_validator(mode="before")
    @classmethod
    def _nest(cls, values: Any) -> Any:
        """Flat settings into their nested configs. A nested config may be given whole too; a flat setting
        named like its config (a coordinator's ``checkpoints``: the URL) is one when given as a plain value."""
        if not isinstance(values, dict) or not any(name in values for name in cls.flat):
            return values
        values = dict(values)
        for name, (group, field) in cls.flat.items():
            if name not in values or (name == group and isinstance(values[name], (dict, BaseModel, type(None)))):
                continue
            value = values.pop(name)
            if value is None:  # not set
                continue
            nested = values.get(group)
            nested = nested.model_dump() if isinstance(nested, BaseModel) else dict(nested or {})
            nested[field] = value
            values[group] = nested
        return values

    def __getattr__(self, name: str) -> Any:
        """A flat setting, read from its nested config."""
        place = type(self).flat.get(name)
        if place is None:
            return super().__getattr__(name)  # type: ignore[misc]
        group = getattr(self, place[0])
        return None if group is None else getattr(group, place[1])


def settings(model: type[Settings]) -> dict[str, FieldInfo]:
    """The settings operators write, by flat name: the model's own fields and those of its nested configs."""
    nested = {group for group, _ in model.flat.values()}
    own = {name: f for name, f in model.model_fields.items() if name not in nested}
    for name, (group, field) in model.flat.items():
        own[name] = _model_of(model.model_fields[group]).model_fields[field]
    return own


def flat_values(config: Settings) -> dict[str, Any]:
    """``config`` as flat settings (the inverse of ``Settings._nest``)."""
    values = {}
    for name in settings(type(config)):
        group, field = type(config).flat.get(name, (None, name))
        owner = config if group is None else getattr(config, group)
        values[name] = None if owner is None else getattr(owner, field)
    return values


def _model_of(field: FieldInfo) -> type[Settings]:
    return next(t for t in getattr(field.annotation, "__args__", (field.annotation,)) if isinstance(t, type) and issubclass(t, Settings))


class StoreConfig(Settings):
    """One process's RocksDB store (embedded, or a node's partitions)."""

    partitions: int = Field(271, ge=1, le=65536, description="P: partition count, fixed at creation")
    memory_bytes: int = Field(256 * MiB, ge=8 * MiB, description="block cache of all partitions, which holds their memtables, index and bloom filter blocks too; on a node an eighth of it holds the batches its replicas keep in memory instead")
    max_key_bytes: int = Field(16 * MiB, ge=1, description="largest encoded key")
    max_value_bytes: int = Field(16 * MiB, ge=1, description="largest encoded value")
    ttl_sweep_interval: float = Field(60.0, gt=0, description="seconds between background removals of expired entries")
    request_window: float = Field(300.0, gt=0, description="seconds a write's request id is kept (see store/requests.py), so a client's retry of it is not applied twice; longer than any client's retry_timeout")
    max_open_files: int = Field(64, ge=-1, description="SST files the node's RocksDB keeps open; -1 keeps every file open")


M = TypeVar("M", bound=Settings)


def load(model: type[M], path: str | None = None, **overrides: Any) -> M:
    values: dict[str, Any] = _read_yaml(path) if path else {}
    for name in settings(model):
        env = os.environ.get(f"ROCKSTATE_{name.upper()}")
        if env is not None:
            values[name] = env
    values.update({k: v for k, v in overrides.items() if v is not None})
    return validate(model, values)


def _read_yaml(path: str) -> dict[str, Any]:
    import yaml  # here: only a config file needs it, and every process started pays an import at the top (~30 ms)

    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"config file {path} is not valid YAML{where}: {getattr(e, 'problem', None) or e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must be a mapping of setting: value, not a {type(data).__name__}")
    return data


def _problem(model: type[Settings], error: dict) -> str:
    loc = tuple(map(str, error["loc"]))
    flat = {place: name for name, place in model.flat.items()}
    where = flat.get(loc[:2], ".".join(loc)) or "config"  # as the operator wrote it
    if error["type"] == "extra_forbidden":
        return f"{where}: unknown setting (settings are {', '.join(settings(model))})"
    return f"{where}: {error['msg']} (got {error.get('input')!r})"


def validate(model: type[M], values: dict[str, Any]) -> M:
    try:
        return model.model_validate(values)  # not model(**values): a YAML key may be no str
    except ValidationError as exc:
        problems = "; ".join(_problem(model, e) for e in exc.errors())
        raise ConfigError(f"invalid {model.__name__}: {problems}") from None


class SecurityConfig(Settings):
    """The cluster's shared secret and TLS files (a coordinator's, a node's)."""

    secret_file: str | None = Field(None, description="file holding the cluster's secret, one per line (or set ROCKSTATE_SECRET): the node credential, and every role's when client_secret_file and admin_secret_file are not set; the first line is presented, every line accepted (two during a rotation); see docs/security.md")
    client_secret_file: str | None = Field(None, description="file holding the clients' secrets, one per line (data, states, checkpoints; not node-to-node nor admin operations); None: the node secret is the clients' too")
    admin_secret_file: str | None = Field(None, description="file holding the administrators' secrets, one per line (restore, making a node leave); None: the node secret is the administrators' too")
    http_secret_file: str | None = Field(None, description="file holding the read-only HTTP credential(s), one per line, every line accepted (two during a rotation): the password of the status page, its JSON API and every /metrics (basic auth, any user name, or a bearer token); never an RPC secret. None: without a cluster secret HTTP is open, with one HTTP refuses every request (403) until this is set")
    tls_cert_file: str | None = Field(None, description="PEM certificate this process presents (enables TLS)")
    tls_key_file: str | None = Field(None, description="PEM private key of tls_cert_file")
    tls_ca_file: str | None = Field(None, description="PEM CA bundle that peers' certificates must chain to")


_SECURITY = {name: ("security", name) for name in SecurityConfig.model_fields}


class CheckpointConfig(Settings):
    """Checkpoints to external storage (embedded mode; a cluster's coordinator and nodes too)."""

    url: str | None = Field(None, description="storage URL: file:///path, s3://bucket/prefix, hdfs://..., oss://...; None: no checkpoints")
    storage_options: dict[str, Any] = Field(default_factory=dict, description="passed to the fsspec filesystem (S3: key, secret, endpoint_url...)")
    cluster: str = Field("default", description="folder under the URL, so clusters can share a bucket")
    retained: int = Field(3, ge=1, description="completed checkpoints kept; older ones and files only they use are deleted")
    interval: float | None = Field(None, gt=0, description="seconds between periodic checkpoints; None: manual only")
    timeout: float = Field(600.0, gt=0, description="a checkpoint not complete after this many seconds is aborted")
    min_pause: float = Field(0.0, ge=0, description="seconds from the end of one checkpoint to the next periodic one")
    tolerable_failures: int = Field(3, ge=0, description="consecutive failed checkpoints before periodic ones stop and an error is reported")
    local_snapshots: int = Field(2, ge=0, description="local snapshots of the node's RocksDB kept, for restores without downloading")
    transfer_threads: int | None = Field(None, ge=1, description="files uploaded or downloaded at once (None: 16 for object stores, one per core for file systems)")
    verify_local: bool = Field(True, description="check local snapshot files' checksums before restoring from them")
    sweep: bool = Field(True, description="list the storage after a checkpoint and delete files no retained checkpoint uses: after the first, after an abort, else every 10 minutes")
    accept_unsigned: bool = Field(False, description="with a cluster secret, also restore checkpoints whose _metadata has no HMAC (written before rockstate signed them, or without a secret); anyone who can write to the storage can then plant one: turn it off once a signed checkpoint exists")


class CoordinatorConfig(Settings):
    """The coordinator process."""

    flat: ClassVar = {"checkpoints": ("checkpoints", "url"), "checkpoint_interval": ("checkpoints", "interval"),
                      "retained_checkpoints": ("checkpoints", "retained"), "checkpoint_timeout": ("checkpoints", "timeout"),
                      "cluster_name": ("checkpoints", "cluster"), "accept_unsigned_checkpoints": ("checkpoints", "accept_unsigned"),
                      **_SECURITY}

    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(7700, ge=0, le=65535, description="port to listen on (0: any free port)")
    http_port: int | None = Field(None, ge=0, le=65535, description="port of the status page, its JSON API (/api/status) and Prometheus /metrics (None: off; 0: any free port)")
    data_dir: str = Field("./rockstate-coordinator", description="where the table, membership and catalog are kept")
    partitions: int = Field(271, ge=1, le=65536, description="P, for a new cluster; an existing one keeps its own")
    heartbeat_timeout: float = Field(5.0, gt=0, description="seconds of silence after which a node is dead; a node cut off from the coordinator stops serving after half of it")
    max_concurrent_migrations: int = Field(2, ge=1, description="copies in flight at once: with backup_count 0, partitions moving; with backups, transfers of backup copies each node takes part in at once (as the backup or the primary), each carrying up to 512 partitions of one primary to one backup, as one export (a join or a leave runs up to 256 handovers at once)")
    initial_cluster_size: int = Field(1, ge=1, description="a new cluster assigns its partitions once this many nodes have joined (no moves while the first nodes come up one by one); later joins rebalance at once")
    live_migration: bool = Field(True, description="copy a moving partition while it serves and freeze it only for the last delta; False: freeze for the whole copy")
    backup_count: int = Field(1, ge=0, le=8, description="backups of every partition on other nodes (other zones when nodes have --zone), kept in sync by its primary; a node death loses no acknowledged write; 0: none, a dead node's partitions come back from the latest checkpoint")
    replication: Literal["sync", "async"] = Field("sync", description="sync: a write is acknowledged once every in-sync backup applied it; async: once the primary applied it (a primary's death may lose what its backups had not applied yet)")
    replica_timeout: float = Field(1.0, gt=0, description="seconds a backup may take to apply a batch before its primary has the coordinator take it out of the in-sync set (it catches up and is added back)")
    max_key_bytes: int = Field(16 * MiB, ge=1, description="largest encoded key, for every node")
    max_value_bytes: int = Field(16 * MiB, ge=1, description="largest encoded value, for every node")
    checkpoints: CheckpointConfig | None = Field(None, description="checkpoint storage URL (file:///..., s3://bucket/prefix); None: no checkpoints")  # the checkpoint_* settings too
    security: SecurityConfig = Field(default_factory=SecurityConfig, description="the settings secret_file and tls_*_file")
    zookeeper: str | None = Field(None, description="ZooKeeper's host:port[,host:port...]: one of several coordinators, the elected one leads and the control plane lives in ZooKeeper under /rockstate/<cluster_name> (None: a single coordinator with its data directory)")
    zookeeper_session_timeout: float = Field(4.0, gt=0, description="seconds ZooKeeper keeps a silent coordinator's session (at least twice the servers' tickTime): a standby leads about this long after the leader dies; below heartbeat_timeout / 2 nodes keep serving through a leader change, above it the data path waits meanwhile")


class NodeConfig(Settings):
    """A node process."""

    flat: ClassVar = {"memory_bytes": ("store", "memory_bytes"), "ttl_sweep_interval": ("store", "ttl_sweep_interval"),
                      "request_window": ("store", "request_window"), **_SECURITY}

    coordinator: str = Field("127.0.0.1:7700", description="the coordinator's host:port; several coordinators' as host:port,host:port... or zk://zkhost:port,.../<cluster_name> (it follows the leader)")
    host: str = Field("127.0.0.1", description="address to listen on (0.0.0.0: every interface)")
    advertise_host: str | None = Field(None, description="address clients and other nodes reach this node at (None: host; with a wildcard host, this machine's name)")
    port: int = Field(0, ge=0, le=65535, description="port to listen on (0: any free port)")
    data_dir: str = Field("./rockstate-node", description="the node's partitions and identity")
    zone: str | None = Field(None, description="failure domain (rack, availability zone): a partition's backups go to other zones when there are enough")
    heartbeat_interval: float = Field(0.5, gt=0, description="seconds between heartbeats (at most a third of the node's lease, which is half the coordinator's heartbeat_timeout)")
    metrics_port: int | None = Field(None, ge=0, le=65535, description="Prometheus /metrics port (None: off)")
    store: StoreConfig = Field(default_factory=StoreConfig, description="the settings memory_bytes, ttl_sweep_interval and request_window; the coordinator gives partitions and the key and value limits")
    security: SecurityConfig = Field(default_factory=SecurityConfig, description="the settings secret_file and tls_*_file")
