"""State as data: ``spark.read.format("rockstate")`` reads one state of a checkpoint as a DataFrame.

(The same format written as a stream, ``df.writeStream.format("rockstate")``, is the sink of ``sink.py``.)

::

    from . import register_data_source

    register_data_source(spark)
    df = (spark.read.format("rockstate")
          .option("url", "s3://bucket/checkpoints")   # the cluster's checkpoint storage
          .option("state", "orders")
          .load())                                     # key, value, partition (map states: key, user_key, value, partition)

Options:

- ``url`` (or ``load(url)``): the checkpoint storage URL the cluster was started with;
- ``state``: the state to read;
- ``cluster``: the cluster's folder in the storage (default ``"default"``);
- ``checkpoint``: a completed checkpoint's id (default: the latest completed
  one, chosen when the query is planned), or ``savepoint``: a savepoint's name;
- ``storage_options``: JSON of fsspec options for the storage (S3 settings
  also come from the standard AWS environment variables, on every executor);
- ``json``: ``"true"`` renders every value of a string column as JSON (see below).

Reading needs no running cluster: each Spark task takes one state partition,
fetches its files from the checkpoint (checked against their checksums) into
a temporary folder, opens that RocksDB read-only, reads the state's column
family in key order, and removes the folder. TTL states: entries expired at
read time are skipped. A checkpoint that retention deletes while a query
reads it fails the query (its files are gone): read a savepoint for long jobs.

Columns. Without a schema the DataFrame is ``key string, value string,
partition int`` (``key, user_key, value, partition`` for a map state). Keys
and values are msgpack values of any type, so a string column holds a str as
it is and any other value as JSON: numbers, ``true``/``false``/``null``,
tuples (several-column keys) and lists as arrays, dicts as objects, bytes as
``{"$base64": "..."}`` (with ``json=true`` a str is JSON too, quoted, so every
cell parses with ``from_json``). A list state's value is its list. Give
``.schema(...)`` for typed columns: any of ``key``, ``user_key`` (map states),
``value``, ``partition`` (int), and ``expires_at`` (timestamp; null for states
without TTL), in any order; each column gets the decoded values as they are
(a several-column key fits a struct, a list an array, a dict a struct or map),
except that string columns follow the rule above. A value that does not fit
its column's type fails the read, naming the column.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import types as T
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from rocksdict import AccessType, Options, Rdict, ReadOptions

from ..checkpoint.restore import candidates, load_manifest, load_manifests, load_metadata, restore_partition
from ..checkpoint.savepoint import read_savepoint
from ..checkpoint.storage import CheckpointStorage
from ..errors import ConfigError, InvalidInputError, UnknownStateError
from ..serde import decode_key, decode_stream, decode_value, split_pair
from ..store.keygroups import bounds
from ..store.partition import now_ms
from .compat import to_arrow_schema

BATCH_ROWS = 10_000
COLUMNS = ("key", "user_key", "value", "partition", "expires_at")
_EXPIRY = struct.Struct(">Q")


def register_data_source(spark: SparkSession) -> None:
    """Make ``spark.read.format("rockstate")`` available in this session."""
    spark.dataSource.register(RockstateDataSource)


def default_schema(kind: str) -> T.StructType:
    """``key string, value string, partition int``; a map state's has ``user_key string`` after ``key``."""
    names = ["key", "user_key", "value"] if kind == "map" else ["key", "value"]
    return T.StructType([*(T.StructField(n, T.StringType()) for n in names), T.StructField("partition", T.IntegerType())])


class _Source:
    """The parsed options: where the checkpoint is and which state to read (picklable)."""

    def __init__(self, options: dict) -> None:
        options = {k.lower(): v for k, v in options.items()}
        self.url = options.get("url") or options.get("path")
        if not self.url:
            raise ConfigError('the rockstate data source needs option "url": the checkpoint storage URL')
        self.state = options.get("state")
        if not self.state:
            raise ConfigError('the rockstate data source needs option "state": the state to read')
        self.cluster = options.get("cluster") or "default"
        self.savepoint = options.get("savepoint")
        checkpoint = options.get("checkpoint")
        if checkpoint is not None and self.savepoint is not None:
            raise ConfigError('give option "checkpoint" or "savepoint", not both')
        try:
            self.checkpoint = None if checkpoint in (None, "") else int(checkpoint)
        except ValueError:
            raise ConfigError(f'option "checkpoint" must be a checkpoint id, got {checkpoint!r}') from None
        try:
            self.storage_options = json.loads(options.get("storage_options") or "{}")
        except ValueError as exc:
            raise ConfigError(f'option "storage_options" must be a JSON object: {exc}') from None
        if not isinstance(self.storage_options, dict):
            raise ConfigError('option "storage_options" must be a JSON object')
        self.json = str(options.get("json", "false")).lower() in ("true", "1", "yes")

    def storage(self, workers: int | None = None) -> CheckpointStorage:
        return CheckpointStorage(self.url, self.storage_options, self.cluster, workers)

    def resolve(self) -> tuple[int, str, dict]:
        """(checkpoint id, base folder, the state's spec) of what to read."""
        storage = self.storage(workers=2)
        try:
            if self.savepoint is not None:
                _, meta, base = read_savepoint(storage, self.savepoint)
            else:
                base = ""
                meta = load_metadata(storage, candidates(storage, self.checkpoint)[0])
        finally:
            storage.close()
        spec = meta.states.get(self.state)
        if spec is None:
            raise UnknownStateError(f"checkpoint {meta.checkpoint_id} in {self.url} has no state {self.state!r}; "
                                    f"its states are {sorted(meta.states)}", state=self.state)
        return meta.checkpoint_id, base, dict(spec)


class RockstateDataSource(DataSource):
    """``spark.read.format("rockstate")``: a state of a checkpoint; see the module's docstring."""

    @classmethod
    def name(cls) -> str:
        return "rockstate"

    def schema(self) -> T.StructType:
        _, _, spec = _Source(self.options).resolve()
        return default_schema(spec["kind"])

    def streamWriter(self, schema: T.StructType, overwrite: bool):
        """``df.writeStream.format("rockstate")``: see ``sink``."""
        from .sink import stream_writer

        return stream_writer(self.options, schema)

    def writer(self, schema: T.StructType, overwrite: bool):
        raise InvalidInputError('format("rockstate") writes streams (df.writeStream); write a batch DataFrame into a state '
                                "with rockstate.spark.bulk_load, or put_many")

    def reader(self, schema: T.StructType) -> "RockstateReader":
        return RockstateReader(_Source(self.options), schema)


class StatePartition(InputPartition):
    """The state partitions of one checkpoint whose files are one process's: what a Spark task reads (so a
    process's files are fetched once, whatever its number of partitions)."""

    def __init__(self, pids: list[int], checkpoint: int, base: str, kind: str, ttl: float | None) -> None:
        super().__init__(pids[0])
        self.pids, self.checkpoint, self.base, self.kind, self.ttl = pids, checkpoint, base, kind, ttl


class RockstateReader(DataSourceReader):
    def __init__(self, source: _Source, schema: T.StructType) -> None:
        self.source = source
        self.schema = schema
        names = schema.fieldNames()
        unknown = [n for n in names if n not in COLUMNS]
        if unknown or len(set(names)) != len(names):
            raise InvalidInputError(f"the rockstate data source has columns {', '.join(COLUMNS)} (each at most once); "
                                    f"the schema asks for {names}")

    def partitions(self) -> list[StatePartition]:
        checkpoint, base, spec = self.source.resolve()
        if "user_key" in self.schema.fieldNames() and spec["kind"] != "map":
            raise InvalidInputError(f"state {self.source.state!r} is a {spec['kind']} state: it has no user_key column")
        storage = self.source.storage(workers=8)
        try:
            manifests = load_manifests(storage, load_metadata(storage, checkpoint, base), None, base)
        finally:
            storage.close()
        groups: dict[tuple[str, ...], list[int]] = {}
        for pid, manifest in sorted(manifests.items()):
            groups.setdefault(tuple(sorted(manifest.paths)), []).append(pid)
        return [StatePartition(pids, checkpoint, base, spec["kind"], spec.get("ttl")) for pids in groups.values()]

    def read(self, partition: StatePartition) -> Iterator[pa.RecordBatch]:
        folder = tempfile.mkdtemp(prefix="rockstate-read-")
        storage = self.source.storage(workers=4)
        try:
            meta = load_metadata(storage, partition.checkpoint, partition.base)
            manifest = load_manifest(storage, meta, partition.pids[0], partition.base)
            path = os.path.join(folder, "db")
            restore_partition(storage, manifest, path, base=partition.base, verify_local=False)
            for pid in partition.pids:  # the group's manifests name the same files (partitions() grouped them so)
                yield from self._batches(path, partition, pid, manifest.key_group is not None)
        finally:
            storage.close()
            shutil.rmtree(folder, ignore_errors=True)

    def _batches(self, path: str, partition: StatePartition, pid: int, key_group: bool) -> Iterator[pa.RecordBatch]:
        opts = Options(raw_mode=True)
        families = {n: Options(raw_mode=True) for n in Rdict.list_cf(path, opts) if n != "default"}
        if self.source.state not in families:
            return  # the partition never had the state: nothing in it
        db = Rdict(path, opts, column_families=families, access_type=AccessType.read_only())
        try:
            rows = _Rows(self.schema, partition, pid, self.source.json)
            start, end = bounds(pid) if key_group else (b"", None)
            read = ReadOptions()
            if end is not None:
                read.set_iterate_upper_bound(end)
            cut = len(start)
            for key, value in db.get_column_family(self.source.state).items(from_key=start, read_opt=read):
                if rows.add(key[cut:], value) >= BATCH_ROWS:
                    yield rows.batch()
            if rows.count:
                yield rows.batch()
        finally:
            db.close()


class _Rows:
    """Decoded entries gathered column by column into Arrow record batches."""

    def __init__(self, schema: T.StructType, partition: StatePartition, pid: int, all_json: bool) -> None:
        self.schema, self.arrow_schema = schema, to_arrow_schema(schema)
        self.names = schema.fieldNames()
        self.pid, self.map = pid, partition.kind == "map"
        self.decode = decode_stream if partition.kind == "list" else decode_value
        self.ttl = partition.ttl is not None
        self.now = now_ms()
        self.render = [_renderer(f.dataType, all_json) for f in schema.fields]
        self.columns: dict[str, list] = {n: [] for n in self.names}
        self.count = 0

    def add(self, stored_key: bytes, stored_value: bytes) -> int:
        expires = None
        if self.ttl:
            (expires,) = _EXPIRY.unpack_from(stored_value)
            if expires <= self.now:
                return self.count
            stored_value = stored_value[8:]
        cols = self.columns
        if self.map:
            key, user_key = split_pair(stored_key)
            if "user_key" in cols:
                cols["user_key"].append(user_key)
        else:
            key = decode_key(stored_key)
        if "key" in cols:
            cols["key"].append(key)
        if "value" in cols:
            cols["value"].append(self.decode(stored_value))
        if "partition" in cols:
            cols["partition"].append(self.pid)
        if "expires_at" in cols:
            cols["expires_at"].append(None if expires is None else datetime.datetime.fromtimestamp(expires / 1000, datetime.timezone.utc))
        self.count += 1
        return self.count

    def batch(self) -> pa.RecordBatch:
        arrays = []
        for name, field, render in zip(self.names, self.arrow_schema, self.render):
            values = self.columns[name]
            if render is not None:
                values = [None if v is None else render(v) for v in values]
            try:
                arrays.append(pa.array(values, type=field.type))
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
                sample = next((v for v in values if v is not None), None)
                raise InvalidInputError(
                    f"column {name!r} is {self.schema[name].dataType.simpleString()}, but partition {self.pid} holds values "
                    f"such as {sample!r} that do not fit it ({exc}); read it as a string column (JSON) instead",
                    column=name) from None
        self.columns = {n: [] for n in self.names}
        self.count = 0
        return pa.RecordBatch.from_arrays(arrays, schema=self.arrow_schema)


def _renderer(dtype: T.DataType, all_json: bool):
    if not isinstance(dtype, T.StringType):
        return None
    if all_json:
        return to_json
    return lambda v: v if type(v) is str else to_json(v)


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return {"$base64": base64.b64encode(value).decode("ascii")}
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def to_json(value: Any) -> str:
    """The JSON rendering of a decoded key or value: tuples as arrays, bytes as {"$base64": ...}."""
    return json.dumps(value, default=_json_default, ensure_ascii=False, separators=(",", ":"))
