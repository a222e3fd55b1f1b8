"""``bulk_load``: write a DataFrame into a state as sorted SST files, one per rockstate partition.

On the driver, the state is defined (a value state, or a map state with
``user_key=``), every row gets its rockstate partition from Spark SQL
(``with_partition``) and the rows are shuffled so that each Spark task holds
whole rockstate partitions, of as few owners as possible (``route_by_owner``).
Each task then, partition by partition: encodes the keys and values as the
state handles do (msgpack; a TTL state's values get their expiry header,
``now + ttl`` at load time), sorts the entries by their stored key (RocksDB's
bytewise order; integer keys are ordered vectorized, since msgpack's integer
encoding has a simple order), writes one SST file, and hands it to
``ClusterBackend.ingest_sst``, which uploads it to the partition's owner and
ingests it there (see ``cluster/ingest.py``). Building the next file overlaps
the upload of the previous one.

Semantics: like ``put_many`` of every row. Entries with other keys stay;
entries with the same key are overwritten; each file (one partition's rows)
becomes visible atomically. A Spark task that is retried ingests its files
again, which leaves the same state. Bulk loads are not part of exactly-once
micro-batches (they are neither staged nor undone by a rewind).

Duplicate keys (or (key, user_key) pairs for a map state) in the DataFrame:
``duplicates="error"`` (the default) fails the load naming a duplicated key,
before that partition's file is ingested (files of other partitions may have
been ingested already); ``duplicates="last"`` keeps the row the task sees last,
which after Spark's shuffle is not a deterministic choice.

``shuffle=False`` skips Spark's shuffle, which is most of a bulk load's time:
each task of the DataFrame as it is partitioned computes its rows' partitions
itself (``partitions_of``, the same hash), and writes one file per rockstate
partition it has rows of. A partition then gets up to one file per task,
ingested one after the other (RocksDB keeps overlapping files in level 0
until it compacts them, so keep the tasks few: tens, not thousands), and a key
found in two tasks is not reported as a duplicate: one of its rows wins.

Limits of this version: value and map states only (not list states); a
task keeps its rows in memory (as Arrow, and one partition's encoded entries
at a time), so give ``tasks=`` enough tasks for the data.
"""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import types as T

from ..errors import InvalidInputError, InvalidValueError
from ..keys import partitions_of
from ..serde import _pack, encode_keys, encode_values
from ..states import MapState, ValueState
from ..cluster.client.bulk import write_sst
from ..store.partition import now_ms
from .arrow_values import encode_column
from .client import StateClientSpec, as_spec, backend_for
from .partitioning import PARTITION_COLUMN, key_columns, key_names, route_by_owner, with_partition

_EXPIRY = struct.Struct(">Q")  # a TTL state's value header (see store/partition.py)
_RESULT_SCHEMA = "partition int, rows long, bytes long"
_ATOMIC = (T.NullType, T.BooleanType, T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.FloatType, T.DoubleType,
           T.StringType, T.BinaryType)


@dataclass(frozen=True)
class BulkLoadResult:
    """What ``bulk_load`` wrote: rows, rockstate partitions, SST files, their bytes, seconds."""

    state: str
    rows: int
    partitions: int
    files: int
    bytes: int
    seconds: float

    @property
    def keys_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0


def bulk_load(
    df: DataFrame,
    state: str,
    key: str | Sequence[str],
    value: str,
    client: object,
    *,
    user_key: str | None = None,
    ttl: float | None = None,
    duplicates: str = "error",
    tasks: int | None = None,
    shuffle: bool = True,
) -> BulkLoadResult:
    """Write ``df`` into ``state``: for every row, key columns ``key`` -> the value in column ``value``.

    ``user_key``: a column of user keys, which makes ``state`` a map state
    (key -> user_key -> value); without it ``state`` is a value state. ``ttl``
    must be the state's TTL (as for ``rs.value_state(name, ttl)``); its entries
    expire ``ttl`` seconds after the load. ``client``: a coordinator address,
    a ``StateClientSpec`` or a ``rockstate.connect`` handle. ``duplicates``:
    "error" or "last" (see the module's docstring). ``tasks``: how many Spark
    tasks build files (default: Spark's default parallelism, at most P).
    ``shuffle=False``: keep the DataFrame's partitioning (see the module's
    docstring); ``tasks`` is then ignored.

    A key is one column's value or a tuple of several columns' values, as the
    state handles take it; values are what msgpack encodes (numbers, booleans,
    strings, binary, nulls, arrays -> lists, structs and maps -> dicts).
    """
    start = time.perf_counter()
    if df.isStreaming:
        raise InvalidInputError("bulk_load takes a batch DataFrame, not a streaming one")
    if duplicates not in ("error", "last"):
        raise InvalidInputError(f"duplicates must be 'error' or 'last', got {duplicates!r}")
    keys = key_names(key)
    columns = _check_columns(df, keys, value, user_key)
    key_columns(df, keys)  # refuses key column types rockstate does not hash
    spec = as_spec(client)
    backend = backend_for(spec)
    handle = (MapState if user_key is not None else ValueState)(backend, state, ttl, create=True)  # defines it, or checks kind and TTL
    P = backend.partitions
    if tasks is None:
        tasks = df.sparkSession.sparkContext.defaultParallelism
    if not isinstance(tasks, int) or isinstance(tasks, bool) or tasks < 1:
        raise InvalidInputError(f"tasks must be a positive int, got {tasks!r}")
    if shuffle:
        owners = [backend.table.owner_address(pid) for pid in range(P)]
        rows = route_by_owner(with_partition(df.select(*columns), keys, P), PARTITION_COLUMN, owners, tasks)
    else:
        rows = df.select(*columns)
    task = _LoadTask(spec, state, keys, value, user_key, int(handle.spec.ttl * 1000) if handle.spec.ttl else None,
                     duplicates, backend.max_key_bytes, backend.max_value_bytes, None if shuffle else P)
    written = rows.mapInArrow(task, _RESULT_SCHEMA).collect()
    return BulkLoadResult(state, sum(r["rows"] for r in written), len({r["partition"] for r in written}), len(written),
                          sum(r["bytes"] for r in written), time.perf_counter() - start)


def _check_columns(df: DataFrame, keys: list[str], value: str, user_key: str | None) -> list[str]:
    fields = {f.name: f.dataType for f in df.schema.fields}
    named = [*keys, *([user_key] if user_key is not None else []), value]
    for name in named:
        if not isinstance(name, str) or name not in fields:
            raise InvalidInputError(f"column {name!r} is not in the DataFrame; its columns are {sorted(fields)}")
    if len(set(named)) != len(named):
        raise InvalidInputError(f"key, user_key and value columns must differ, got {named}")
    if PARTITION_COLUMN in named:
        raise InvalidInputError(f"{PARTITION_COLUMN!r} is rockstate's own column name")
    for name in named[len(keys):]:
        bad = _unencodable(fields[name])
        if bad is not None:
            raise InvalidValueError(f"column {name!r} holds {bad.simpleString()} values, which rockstate cannot store; "
                                    "cast them (e.g. timestamps to long or string, decimals to double or string)")
    return named


def _unencodable(dtype: T.DataType) -> T.DataType | None:
    """The part of ``dtype`` that msgpack cannot encode, if any."""
    if isinstance(dtype, _ATOMIC):
        return None
    if isinstance(dtype, T.ArrayType):
        return _unencodable(dtype.elementType)
    if isinstance(dtype, T.MapType):
        return _unencodable(dtype.keyType) or _unencodable(dtype.valueType)
    if isinstance(dtype, T.StructType):
        return next((bad for f in dtype.fields if (bad := _unencodable(f.dataType)) is not None), None)
    return dtype


# -- in the Spark tasks -------------------------------------------------------------------


@dataclass(frozen=True)
class _LoadTask:
    """The ``mapInArrow`` function: rows of whole rockstate partitions in, one result row per file out."""

    spec: StateClientSpec
    state: str
    keys: list[str]
    value: str
    user_key: str | None
    ttl_ms: int | None
    duplicates: str
    max_key_bytes: int
    max_value_bytes: int
    partitions: int | None = None  # set: the rows have no partition column, compute it (shuffle=False)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        batches = [b for b in batches if b.num_rows]
        if not batches:
            return
        table = pa.Table.from_batches(batches)
        if self.partitions is None:
            pids = table.column(PARTITION_COLUMN).to_numpy()
        else:
            pids = partitions_of([table.column(k) for k in self.keys], self.partitions)
        order = np.argsort(pids, kind="stable")
        table, pids = table.take(order), pids[order]
        cuts = np.flatnonzero(pids[1:] != pids[:-1]) + 1
        bounds = list(zip([0, *cuts.tolist()], [*cuts.tolist(), len(pids)]))
        backend = backend_for(self.spec)
        folder = tempfile.mkdtemp(prefix="rockstate-bulk-")
        shipped: list[tuple[int, int, Future]] = []
        try:
            with ThreadPoolExecutor(1, thread_name_prefix="rockstate-bulk-ship") as shipper:
                for a, b in bounds:
                    pid = int(pids[a])
                    path = os.path.join(folder, f"p{pid:04d}.sst")
                    write_sst(path, *self._entries(table.slice(a, b - a)))
                    shipped.append((pid, b - a, shipper.submit(_ship, backend, self.state, pid, path)))
                    if len(shipped) > 1:
                        shipped[-2][2].result()  # one file in flight while the next is built: bounded disk use
            out = [(pid, n, future.result()) for pid, n, future in shipped]
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        yield pa.RecordBatch.from_arrays(
            [pa.array([r[0] for r in out], pa.int32()), pa.array([r[1] for r in out], pa.int64()), pa.array([r[2] for r in out], pa.int64())],
            names=["partition", "rows", "bytes"],
        )

    def _entries(self, rows: pa.Table) -> tuple[Iterator[bytes], Iterator[bytes]]:
        """One partition's stored keys and values, in ascending key order, duplicates resolved."""
        columns = [rows.column(k).combine_chunks() for k in self.keys]
        column = rows.column(self.value).combine_chunks()
        values = encode_column(column) if not column.null_count else None  # column-wise: the same bytes, ~20x faster
        if values is None or max(map(len, values), default=0) > self.max_value_bytes:
            values = encode_values(pylist(column), self.max_value_bytes)  # names a bad value
        if self.ttl_ms is not None:
            header = _EXPIRY.pack(now_ms() + self.ttl_ms)
            values = [header + v for v in values]
        ints = _int64s(columns[0]) if len(columns) == 1 and self.user_key is None else None
        if ints is not None:  # the commonest case, vectorized: one bigint key column without nulls
            stored = list(map(_pack, ints.tolist()))
            order = _int_order(ints)
            ordered = ints[order]
            if (ordered[1:] == ordered[:-1]).any():  # duplicates: the slow path, whose sort is stable
                order = self._resolve(stored, sorted(range(len(stored)), key=stored.__getitem__))
            else:
                order = order.tolist()
        else:
            stored = self._stored_keys(rows, columns)
            order = sorted(range(len(stored)), key=stored.__getitem__)  # stable: duplicates stay in input order
            if len(set(stored)) != len(stored):
                order = self._resolve(stored, order)
        return map(stored.__getitem__, order), map(values.__getitem__, order)

    def _stored_keys(self, rows: pa.Table, columns: list[pa.Array]) -> list[bytes]:
        lists = [pylist(c) for c in columns]
        keys = lists[0] if len(lists) == 1 else list(zip(*lists))
        stored = encode_keys(keys, self.max_key_bytes)
        if self.user_key is not None:
            user_keys = encode_keys(pylist(rows.column(self.user_key).combine_chunks()), self.max_key_bytes)
            stored = [k + u for k, u in zip(stored, user_keys)]
        return stored

    def _resolve(self, stored: list[bytes], order: list[int]) -> list[int]:
        """``order`` (sorted, stable) with one row per key: the last one, or an error."""
        kept = []
        for i in order:
            if kept and stored[kept[-1]] == stored[i]:
                if self.duplicates == "error":
                    raise InvalidInputError(
                        f"bulk_load into {self.state!r}: the DataFrame has the {'(key, user_key)' if self.user_key else 'key'} "
                        f"{_describe(stored[i], self.user_key is not None)} more than once; pass duplicates='last' to keep one",
                        state=self.state)
                kept[-1] = i
            else:
                kept.append(i)
        return kept


def _ship(backend: Any, state: str, pid: int, path: str) -> int:
    try:
        return backend.ingest_sst(state, pid, path)
    finally:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _describe(stored: bytes, pair: bool) -> str:
    from ..serde import decode_key, split_pair

    return repr(split_pair(stored) if pair else decode_key(stored))


def _int64s(column: pa.Array) -> np.ndarray | None:
    """An integer column without nulls as int64 (None: not one)."""
    if column.null_count or not pa.types.is_integer(column.type):
        return None
    if pa.types.is_uint64(column.type):
        return None  # may hold values past bigint: the row path names them
    return column.cast(pa.int64()).to_numpy()


def _int_order(values: np.ndarray) -> np.ndarray:
    """The order of int64 ``values`` by their msgpack encodings, bytewise (not stable).

    msgpack writes non-negative ints as 0x00-0x7f or 0xcc-0xcf + big-endian
    bytes, and negative ones as 0xd0-0xd3 + two's complement (int8, int16,
    int32, int64) or 0xe0-0xff (-32..-1): each encoding orders its own values
    numerically, and the encodings order by their first byte.
    """
    order = np.argsort(values)
    neg = values < 0
    if not neg.any():
        return order
    rank = np.zeros(len(values), dtype=np.int8)
    rank[neg & (values < -32)] = 1
    rank[neg & (values < -128)] = 2
    rank[neg & (values < -32768)] = 3
    rank[neg & (values < -(2**31))] = 4
    rank[neg & (values >= -32)] = 5
    return order[np.argsort(rank[order], kind="stable")]  # numeric order within each encoding


def pylist(column: pa.Array) -> list:
    """A column as Python values (maps as dicts), much faster than ``to_pylist`` for flat columns."""
    t = column.type
    if pa.types.is_null(t):
        return [None] * len(column)
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        if not column.null_count:
            return column.to_numpy(zero_copy_only=False).tolist()
        out = column.fill_null(False if pa.types.is_boolean(t) else 0).to_numpy(zero_copy_only=False).tolist()
        for i in np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False)).tolist():
            out[i] = None
        return out
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return column.to_numpy(zero_copy_only=False).tolist()
    out = column.to_pylist()
    return [_maps_to_dicts(v, t) for v in out] if _has_map(t) else out


def _has_map(t: pa.DataType) -> bool:
    if pa.types.is_map(t):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _has_map(t.value_type)
    if pa.types.is_struct(t):
        return any(_has_map(t.field(i).type) for i in range(t.num_fields))
    return False


def _maps_to_dicts(value: Any, t: pa.DataType) -> Any:
    """``to_pylist`` gives a map as a list of (key, value) pairs: make it a dict, at any depth."""
    if value is None:
        return None
    if pa.types.is_map(t):
        return {_maps_to_dicts(k, t.key_type): _maps_to_dicts(v, t.item_type) for k, v in value}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return [_maps_to_dicts(v, t.value_type) for v in value]
    if pa.types.is_struct(t):
        return {f.name: _maps_to_dicts(value[f.name], f.type) for f in t}
    return value
