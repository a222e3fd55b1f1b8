"""Value, Map and List state over explicit keys: the user-facing handles.

A handle encodes keys and values, finds each key's partition, and hands the
backend one group of operations per partition. The backend is the embedded
store or the cluster's routing client: the handles are the same for both.
Bad input is found while encoding, before anything is sent, so a batch with
one bad item writes nothing.

Making a handle defines nothing unless ``create=True``: a handle to a state that
does not exist yet defines it on its first write (as a Redis key or a Hazelcast
map comes to be), and a read of it raises ``UnknownStateError`` naming the
states it may have meant, so a misspelt name is never a new empty state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Protocol

import numpy as np

from . import keys as keyhash
from .serde import decode_key, decode_stream, decode_value, decode_values, encode_key, encode_keys, encode_value, encode_values, split_pair
from .errors import InvalidInputError, UnknownStateError
from .ops import APPEND, DELETE, DELETE_MANY, DELETE_PREFIX, PUT, PUT_MANY
from .runs import read_columns, write_order
from .store.catalog import StateSpec, check_name

try:
    import pyarrow as pa
except ImportError:  # only needed for Arrow input
    pa = None

if TYPE_CHECKING:
    from .checkpoint.coordinator import CheckpointRecord
    from .checkpoint.restore import RestoreResult
    from .checkpoint.savepoint import SavepointInfo
    from .ops import Op

SCAN_PAGE = 1000


class Checkpointer(Protocol):
    """A backend's checkpoints (embedded: ``checkpoint/local.py``; a cluster: ``cluster/client.py``)."""

    last_restore: "RestoreResult | None"  # the latest restore through this handle (or on opening it)

    def checkpoint(self) -> "CheckpointRecord": ...
    def checkpoints(self) -> list["CheckpointRecord"]: ...
    def restore(self, checkpoint_id: int | None = None, savepoint: str | None = None) -> "RestoreResult": ...
    def savepoint(self, name: str, checkpoint_id: int | None = None) -> "SavepointInfo": ...
    def savepoints(self) -> list["SavepointInfo"]: ...


class Backend(Protocol):
    """What a state handle (and ``Rockstate``) needs from where the partitions live."""

    partitions: int
    checkpointer: Checkpointer | None  # None: no checkpoint storage

    @property
    def max_key_bytes(self) -> int: ...  # the cluster's limits (read only: the coordinator's, kept with its table)
    @property
    def max_value_bytes(self) -> int: ...

    def define_state(self, spec: StateSpec, create: bool = True) -> StateSpec: ...  # create=False: UnknownStateError if none
    def write(self, ops_by_pid: dict[int, list["Op"]]) -> None: ...
    def get_many(self, state: str, keys_by_pid: dict[int, list[bytes]]) -> dict[int, list[bytes | None]]: ...
    def read_runs(self, state: str, pids: list[int], counts: list[int], keys: list[bytes]) -> list[bytes | None]: ...  # runs.py
    def write_runs(self, op: int, state: str, pids: list[int], counts: list[int], keys: list[bytes],
                   values: list[bytes] | None) -> None: ...  # runs.py
    def scan(self, state: str, pid: int, prefix: bytes, after: bytes | None, limit: int) -> list[tuple[bytes, bytes]]: ...
    def scan_many(self, state: str, pages_by_pid: dict[int, tuple]) -> dict[int, tuple[list[bytes], list[bytes]]]: ...  # (prefix, after, stop, limit) -> (keys, values)
    def count(self, state: str) -> int: ...
    def compare_and_set(self, state: str, pid: int, key: bytes, expected: bytes | None, new: bytes) -> bool: ...
    def stats(self) -> dict: ...
    def subscribe(self, callback: Callable[[dict], None]) -> Any: ...  # cluster events; embedded: raises
    def close(self) -> None: ...


def key_list(keys: Any) -> list:
    """A list of Python objects from a list, tuple, numpy array, pandas Series/Index, Arrow array or
    other iterable; a DataFrame gives a tuple per row (a scalar per row if it has one column)."""
    if isinstance(keys, list):
        return keys
    if hasattr(keys, "itertuples"):
        rows = list(keys.itertuples(index=False, name=None))
        return [row[0] for row in rows] if keys.shape[1] == 1 else rows
    if pa is not None and isinstance(keys, (pa.Array, pa.ChunkedArray)):
        if pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type) or pa.types.is_binary(keys.type) \
                or pa.types.is_large_binary(keys.type):
            return keys.to_numpy(zero_copy_only=False).tolist()  # the same str/bytes/None, 10x faster than to_pylist
        return keys.to_pylist()
    if hasattr(keys, "tolist") and not isinstance(keys, np.generic):
        return keys.tolist()
    if isinstance(keys, (str, bytes, Mapping)) or not isinstance(keys, Iterable):
        raise InvalidInputError(f"expected a sequence or array of keys, got a {type(keys).__name__}")
    return list(keys)


def _as_column(keys: Any, column: list) -> Any:
    """What ``keys`` is hashed from: the array as given when it has a vectorized type, else the list."""
    if pa is not None and isinstance(keys, (pa.Array, pa.ChunkedArray)) and not pa.types.is_decimal(keys.type):
        return keys
    dtype = getattr(keys, "dtype", None)
    if isinstance(dtype, np.dtype) and dtype.kind in "iufbmM" and getattr(keys, "ndim", 1) == 1:
        return np.asarray(keys)
    return column


def prepare_keys(keys: Any, partitions: int, limit: int, column: list | None = None) -> tuple[list[bytes], np.ndarray]:
    """Encode keys (any sequence or array; ``column``: them as a list, if already made) and find
    their partitions, column-wise: no Python code runs per key of a supported type."""
    column = key_list(keys) if column is None else column
    if not column:
        return [], np.zeros(0, dtype=np.int64)
    types = set(map(type, column))
    if types == {tuple} and len(lengths := set(map(len, column))) == 1 and lengths != {0}:  # tuples: column by column
        columns = list(zip(*column))
        return encode_keys(column, limit, columns), keyhash.partitions_of_columns(columns, partitions)
    encoded = encode_keys(column, limit)
    if len(types) == 1 and types <= {str, bytes}:  # ids, UUIDs: hashed straight from their encodings
        return encoded, keyhash.partitions_of_packed(encoded, partitions, column)
    return encoded, keyhash.partitions_of_columns([_as_column(keys, column)], partitions)


def batch_columns(items: Any, values: Any = None) -> tuple[Any, list, list]:
    """The one batch shape of ``put_many``: a mapping (a pandas Series is one: index -> value), an
    iterable of (key, value) pairs, or ``items`` = keys and ``values`` two sequences/arrays of
    equal length. Returns (keys as given, keys as a list, values as a list)."""
    if values is not None:
        keys, values = items, key_list(values)
    elif isinstance(items, Mapping):
        keys, values = list(items.keys()), list(items.values())
    elif hasattr(items, "index") and hasattr(items, "tolist") and getattr(items, "ndim", 2) == 1:  # a pandas Series
        keys, values = items.index, items.tolist()
    elif hasattr(items, "itertuples"):
        raise InvalidInputError("put_many takes a mapping, (key, value) pairs, or keys and values: "
                                "for a DataFrame pass put_many(df[key_column], df[value_column])")
    else:
        pairs = key_list(items)
        try:
            lengths = set(map(len, pairs))
        except TypeError:
            lengths = set()
        if pairs and lengths != {2}:
            raise InvalidInputError("put_many takes a mapping, (key, value) pairs, or keys and values as two sequences")
        columns = list(zip(*pairs)) or [(), ()]
        keys, values = list(columns[0]), list(columns[1])
    column = key_list(keys)
    if len(column) != len(values):
        raise InvalidInputError(f"put_many: {len(column)} keys but {len(values)} values")
    return keys, column, values


class _State:
    kind = ""

    def __init__(self, backend: Backend, name: str, ttl: float | None = None, create: bool = False) -> None:
        check_name(name)  # names starting with "_" are the system's own
        self.spec = StateSpec(name, self.kind, ttl)
        self.name = name
        self._backend = backend
        self._P = backend.partitions
        try:
            self.spec, self._defined = backend.define_state(self.spec, create), True
        except UnknownStateError:
            self._defined = False  # until a write defines it (or another client does)

    def _reading(self) -> None:
        """Before a read: the state exists (looked up again, another client may have defined it since)."""
        if not self._defined:
            self.spec, self._defined = self._backend.define_state(self.spec, False), True

    def _writing(self) -> None:
        if not self._defined:
            self.spec, self._defined = self._backend.define_state(self.spec), True

    def _write(self, ops_by_pid: dict[int, list["Op"]]) -> None:
        self._writing()
        self._backend.write(ops_by_pid)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} ttl={self.spec.ttl}>"

    def _key(self, key: Any) -> tuple[int, bytes]:
        data = encode_key(key, self._backend.max_key_bytes)
        return keyhash.partition_of(key, self._P), data

    def _value(self, value: Any) -> bytes:
        return encode_value(value, self._backend.max_value_bytes)

    def _write_one(self, pid: int, key: bytes, op: int, value: bytes | None = None) -> None:
        self._write({pid: [(op, self.name, key, value)]})

    def _get_one(self, pid: int, key: bytes) -> bytes | None:
        self._reading()
        return self._backend.read_runs(self.name, [pid], [1], [key])[0]

    def _count(self) -> int:
        self._reading()
        return self._backend.count(self.name)

    def _scan(self, prefix: bytes = b"", pids: Iterable[int] | None = None) -> Iterator[tuple[bytes, bytes]]:
        self._reading()
        for pid in range(self._P) if pids is None else pids:
            after = None
            while True:
                page = self._backend.scan(self.name, pid, prefix, after, SCAN_PAGE)
                yield from page
                if len(page) < SCAN_PAGE:
                    break
                after = page[-1][0]


class ValueState(_State):
    """One value per key."""

    kind = "value"

    def get(self, key: Any, default: Any = None) -> Any:
        data = self._get_one(*self._key(key))
        return default if data is None else decode_value(data)

    def put(self, key: Any, value: Any) -> None:
        pid, k = self._key(key)
        self._write_one(pid, k, PUT, self._value(value))

    def delete(self, key: Any) -> None:
        self._write_one(*self._key(key), DELETE)

    def compare_and_set(self, key: Any, expected: Any, new: Any) -> bool:
        """Set ``key`` to ``new`` if its value is ``expected`` (None: it has none), atomically; returns whether it did.

        Values compare by their encoding (1 and 1.0 differ). On a cluster it
        is retried like a write and applied once; a ``ClusterTimeoutError``
        (the owner unreachable for ``retry_timeout``) means it may or may not
        have happened.
        """
        pid, k = self._key(key)
        self._writing()
        return self._backend.compare_and_set(self.name, pid, k, None if expected is None else self._value(expected), self._value(new))

    def contains(self, key: Any) -> bool:
        return self._get_one(*self._key(key)) is not None

    __contains__ = contains

    def get_many(self, keys: Any, default: Any = None) -> list[Any]:
        """Values of ``keys`` (any sequence or array: list, numpy, pandas, Arrow), in their order."""
        encoded, pids = prepare_keys(keys, self._P, self._backend.max_key_bytes)
        self._reading()
        return decode_values(read_columns(self._backend.read_runs, self.name, encoded, pids), default)

    def put_many(self, items: Any, values: Any = None) -> None:
        """``put_many(mapping)``, ``put_many(pairs)`` or ``put_many(keys, values)`` (see ``batch_columns``)."""
        keys, column, values = batch_columns(items, values)
        evalues = encode_values(values, self._backend.max_value_bytes, column)
        self._write_many(PUT_MANY, keys, evalues, column)

    def delete_many(self, keys: Any) -> None:
        self._write_many(DELETE_MANY, keys, None)

    def _write_many(self, op: int, keys: Any, values: list[bytes] | None, column: list | None = None) -> None:
        encoded, pids = prepare_keys(keys, self._P, self._backend.max_key_bytes, column)
        if not encoded:
            return
        order, groups = write_order(pids, encoded)
        # keys and values put in partition (and key) order once, and sent as runs (columns, runs.py), not a group each
        idx = order.tolist()
        encoded, values = list(map(encoded.__getitem__, idx)), None if values is None else list(map(values.__getitem__, idx))
        if len(groups) == 1:
            self._write({groups[0][0]: [(op, self.name, encoded, values)]})
            return
        self._writing()
        self._backend.write_runs(op, self.name, [pid for pid, _, _ in groups], [b - a for _, a, b in groups], encoded, values)

    def keys(self) -> Iterator[Any]:
        for k, _ in self._scan():
            yield decode_key(k)

    def items(self) -> Iterator[tuple[Any, Any]]:
        for k, v in self._scan():
            yield decode_key(k), decode_value(v)

    def count(self) -> int:
        return self._count()

    __iter__ = keys


class MapState(_State):
    """Per key, a map of user keys to values; each entry is its own RocksDB key."""

    kind = "map"

    def _entry(self, key: Any, user_key: Any) -> tuple[int, bytes]:
        pid, k = self._key(key)
        return pid, k + encode_key(user_key, self._backend.max_key_bytes)

    def get(self, key: Any, user_key: Any, default: Any = None) -> Any:
        data = self._get_one(*self._entry(key, user_key))
        return default if data is None else decode_value(data)

    def put(self, key: Any, user_key: Any, value: Any) -> None:
        pid, k = self._entry(key, user_key)
        self._write_one(pid, k, PUT, self._value(value))

    def put_all(self, key: Any, mapping: Mapping[Any, Any]) -> None:
        pid, k = self._key(key)
        limit = self._backend.max_key_bytes
        ops = [(PUT, self.name, k + encode_key(uk, limit), self._value(v)) for uk, v in mapping.items()]
        if ops:
            self._write({pid: ops})

    def delete(self, key: Any, user_key: Any) -> None:
        self._write_one(*self._entry(key, user_key), DELETE)

    def contains(self, key: Any, user_key: Any) -> bool:
        return self._get_one(*self._entry(key, user_key)) is not None

    def items(self, key: Any) -> Iterator[tuple[Any, Any]]:
        pid, k = self._key(key)
        for entry, v in self._scan(k, [pid]):
            yield decode_key(entry[len(k):]), decode_value(v)

    def keys(self, key: Any) -> Iterator[Any]:
        for uk, _ in self.items(key):
            yield uk

    def clear(self, key: Any) -> None:
        self._write_one(*self._key(key), DELETE_PREFIX)

    def entries(self) -> Iterator[tuple[Any, Any, Any]]:
        """Every (key, user_key, value) of the state."""
        for entry, v in self._scan():
            yield (*split_pair(entry), decode_value(v))

    def count(self) -> int:
        """Number of entries (not of keys)."""
        return self._count()


class ListState(_State):
    """Per key, a list of values."""

    kind = "list"

    def append(self, key: Any, value: Any) -> None:
        pid, k = self._key(key)
        self._write_one(pid, k, APPEND, self._value(value))

    def extend(self, key: Any, values: Iterable[Any]) -> None:
        pid, k = self._key(key)
        data = b"".join(encode_values(values, self._backend.max_value_bytes))
        if data:
            self._write_one(pid, k, APPEND, data)

    def get(self, key: Any) -> list[Any]:
        data = self._get_one(*self._key(key))
        return [] if data is None else decode_stream(data)

    def put(self, key: Any, values: Iterable[Any]) -> None:
        """Replace the list."""
        pid, k = self._key(key)
        data = b"".join(encode_values(values, self._backend.max_value_bytes))
        self._write_one(pid, k, PUT if data else DELETE, data or None)

    def clear(self, key: Any) -> None:
        self._write_one(*self._key(key), DELETE)

    def keys(self) -> Iterator[Any]:
        for k, _ in self._scan():
            yield decode_key(k)

    def count(self) -> int:
        """Number of keys holding a list."""
        return self._count()
