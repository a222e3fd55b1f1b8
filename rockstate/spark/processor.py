"""The user's side of the operator: ``StatefulProcessor`` and its state handles.

A processor gets its states in ``init(handle)`` and implements one of:

- ``handle_batch(batch) -> DataFrame``: vectorized. ``batch`` is a pandas
  DataFrame of many keys' rows; the handles take arrays of keys (and values)
  and answer in order: ``get_many``, ``put_many``, ``delete_many``...
- ``handle_input_rows(key, rows) -> Iterator[DataFrame]``: once per key, the
  shape of Spark's ``transformWithStateInPandas`` (snake_case names, no
  timers). The handles then act on the current key: ``get()``, ``update(v)``,
  ``exists()``, ``clear()``... Porting a Spark processor is renaming.

Either way the operator reads state for a whole batch at once and writes it
back at the end of the batch in one request per owner (see ``batch``): the
handles never talk to the cluster per key. Per-key map-state reads are the one
exception: a key's map is scanned (one request) the first time the batch
reads it, since its user keys are not known in advance.

Values are what rockstate stores: None, bool, int, float, str, bytes, list
and dict (tuples come back as lists). TTLs are in seconds; a write refreshes
an entry's expiry.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pandas as pd

from ..errors import InvalidInputError
from ..serde import decode_key, decode_stream, decode_value, encode_key, encode_values
from ..states import Backend, batch_columns, key_list, prepare_keys
from ..store.catalog import StateSpec, check_name
from .batch import Batch, KeyedView


def _same_length(what: str, keys: list, other: list) -> None:
    if len(keys) != len(other):
        raise InvalidInputError(f"{what}: {len(keys)} keys but {len(other)} values")


class _StateHandle:
    kind = ""

    def __init__(self, owner: StatefulProcessorHandle, spec: StateSpec) -> None:
        self.name, self.spec, self._owner = spec.name, spec, owner
        self._backend = owner.backend

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} ttl={self.spec.ttl}>"

    def _view(self) -> Any:
        return self._owner.batch(self.name).view(self.name, self.kind)

    def _keys(self, keys: Any) -> tuple[list[bytes], np.ndarray]:
        return self._owner.encode_keys(keys)

    def _current(self) -> tuple[bytes, int]:
        current = self._owner.batch(self.name).current
        if current is None:
            raise InvalidInputError(
                f"state {self.name!r}: methods without keys act on the current key and work only inside "
                "handle_input_rows; in handle_batch pass the keys (get_many, put_many, ...)"
            )
        return current

    def _encode(self, values: Iterable[Any]) -> list[bytes]:
        return encode_values(values, self._backend.max_value_bytes)


class ValueStateHandle(_StateHandle):
    """One value per key."""

    kind = "value"

    def get_many(self, keys: Any, default: Any = None) -> list[Any]:
        encoded, pids = self._keys(keys)
        return [default if v is None else decode_value(v) for v in self._view().read(encoded, pids)]

    def put_many(self, keys: Any, values: Any = None) -> None:
        """``put_many(keys, values)``, ``put_many(mapping)`` or ``put_many(pairs)``, as on a plain state."""
        keys, column, values = batch_columns(keys, values)
        encoded, pids = self._owner.encode_keys(keys, column)
        self._view().write_columns(encoded, pids, encode_values(values, self._backend.max_value_bytes, column))

    def delete_many(self, keys: Any) -> None:
        encoded, pids = self._keys(keys)
        self._view().write_columns(encoded, pids, None)

    # -- the current key (handle_input_rows) --

    def exists(self) -> bool:
        return self._view().get(*self._current()) is not None

    def get(self, default: Any = None) -> Any:
        data = self._view().get(*self._current())
        return default if data is None else decode_value(data)

    def update(self, value: Any) -> None:
        key, pid = self._current()
        self._view().write([key], [pid], self._encode([value]))

    def clear(self) -> None:
        key, pid = self._current()
        self._view().write([key], [pid], [None])


class ListStateHandle(_StateHandle):
    """A list of values per key."""

    kind = "list"

    def get_many(self, keys: Any) -> list[list[Any]]:
        encoded, pids = self._keys(keys)
        return [[] if v is None else decode_stream(v) for v in self._view().read(encoded, pids)]

    def put_many(self, keys: Any, lists: Any) -> None:
        """Replace each key's list (an empty list deletes it)."""
        encoded, pids = self._keys(keys)
        lists = key_list(lists)
        _same_length("put_many", encoded, lists)
        data = [b"".join(self._encode(key_list(items))) or None for items in lists]
        self._view().write(encoded, pids.tolist(), data)

    def append_many(self, keys: Any, values: Any) -> None:
        """Append values[i] to the list of keys[i], in order (a key may repeat)."""
        encoded, pids = self._keys(keys)
        values = self._encode(key_list(values))
        _same_length("append_many", encoded, values)
        first = dict(zip(encoded, range(len(encoded))))  # distinct keys, each with one of its rows
        rows = list(first.values())
        lists = dict(zip(first, (v or b"" for v in self._view().read(list(first), pids[rows]))))
        for key, value in zip(encoded, values):
            lists[key] += value
        self._view().write(list(lists), pids[rows].tolist(), list(lists.values()))

    def delete_many(self, keys: Any) -> None:
        encoded, pids = self._keys(keys)
        self._view().write(encoded, pids.tolist(), [None] * len(encoded))

    # -- the current key (handle_input_rows) --

    def _stored(self) -> bytes:
        return self._view().get(*self._current()) or b""

    def exists(self) -> bool:
        return bool(self._stored())

    def get(self) -> Iterator[Any]:
        return iter(decode_stream(self._stored()))

    def put(self, values: Iterable[Any]) -> None:
        key, pid = self._current()
        self._view().write([key], [pid], [b"".join(self._encode(values)) or None])

    def append_value(self, value: Any) -> None:
        self.append_list([value])

    def append_list(self, values: Iterable[Any]) -> None:
        key, pid = self._current()
        data = self._stored() + b"".join(self._encode(values))
        self._view().write([key], [pid], [data or None])

    def clear(self) -> None:
        key, pid = self._current()
        self._view().write([key], [pid], [None])


class MapStateHandle(_StateHandle):
    """A map of user keys to values per key."""

    kind = "map"

    def _user_keys(self, user_keys: Any, n: int) -> list[bytes]:
        limit = self._backend.max_key_bytes
        encoded = [encode_key(uk, limit) for uk in key_list(user_keys)]
        if len(encoded) != n:
            raise InvalidInputError(f"map state {self.name!r}: {n} keys but {len(encoded)} user keys")
        return encoded

    def get_many(self, keys: Any, user_keys: Any, default: Any = None) -> list[Any]:
        encoded, pids = self._keys(keys)
        found = self._view().read(encoded, pids, self._user_keys(user_keys, len(encoded)))
        return [default if v is None else decode_value(v) for v in found]

    def put_many(self, keys: Any, user_keys: Any, values: Any) -> None:
        encoded, pids = self._keys(keys)
        values = self._encode(key_list(values))
        _same_length("put_many", encoded, values)
        self._view().write(encoded, pids.tolist(), self._user_keys(user_keys, len(encoded)), values)

    def delete_many(self, keys: Any, user_keys: Any) -> None:
        """Remove the entry user_keys[i] of keys[i]."""
        encoded, pids = self._keys(keys)
        self._view().write(encoded, pids.tolist(), self._user_keys(user_keys, len(encoded)), [None] * len(encoded))

    def clear_many(self, keys: Any) -> None:
        """Remove every entry of each key."""
        encoded, pids = self._keys(keys)
        self._view().clear(encoded, pids.tolist())

    # -- the current key (handle_input_rows) --

    def _entries(self) -> dict[bytes, bytes]:
        return self._view().entries(*self._current())

    def exists(self) -> bool:
        return bool(self._entries())

    def get_value(self, user_key: Any, default: Any = None) -> Any:
        data = self._view().get(*self._current(), encode_key(user_key, self._backend.max_key_bytes))
        return default if data is None else decode_value(data)

    def contains_key(self, user_key: Any) -> bool:
        return self.get_value(user_key) is not None

    def update_value(self, user_key: Any, value: Any) -> None:
        key, pid = self._current()
        self._view().write([key], [pid], [encode_key(user_key, self._backend.max_key_bytes)], self._encode([value]))

    def remove_key(self, user_key: Any) -> None:
        key, pid = self._current()
        self._view().write([key], [pid], [encode_key(user_key, self._backend.max_key_bytes)], [None])

    def iterator(self) -> Iterator[tuple[Any, Any]]:
        return iter([(decode_key(uk), decode_value(v)) for uk, v in sorted(self._entries().items())])

    def keys(self) -> Iterator[Any]:
        return (uk for uk, _ in self.iterator())

    def values(self) -> Iterator[Any]:
        return (v for _, v in self.iterator())

    def clear(self) -> None:
        key, pid = self._current()
        self._view().clear([key], [pid])


class StatefulProcessorHandle:
    """What ``init`` gets: defines the processor's states and gives their handles."""

    def __init__(self, backend: Backend, namespace: str = "") -> None:
        """``namespace``: prefixed to every state name ("<namespace>.<name>"; "" for the names as given)."""
        self.backend, self.namespace = backend, namespace
        self._handles: dict[str, _StateHandle] = {}
        self._batch: Batch | None = None
        self._last_index: tuple[pd.Index, list[bytes], np.ndarray] | None = None

    @property
    def partitions(self) -> int:
        return self.backend.partitions

    def value_state(self, name: str, ttl: float | None = None) -> ValueStateHandle:
        return self._state(ValueStateHandle, name, ttl)

    def list_state(self, name: str, ttl: float | None = None) -> ListStateHandle:
        return self._state(ListStateHandle, name, ttl)

    def map_state(self, name: str, ttl: float | None = None) -> MapStateHandle:
        return self._state(MapStateHandle, name, ttl)

    def _state(self, cls: type, name: str, ttl: float | None) -> Any:
        check_name(name)
        if self.namespace:
            name = check_name(f"{self.namespace}.{name}")
        wanted = StateSpec(name, cls.kind, ttl)
        handle = self._handles.get(name)
        if handle is not None:
            handle.spec.check_same(wanted)
            return handle
        handle = self._handles[name] = cls(self, self.backend.define_state(wanted))
        return handle

    def encode_keys(self, keys: Any, column: list | None = None) -> tuple[list[bytes], np.ndarray]:
        """Encoded keys and their partitions. A pandas Index is immutable, so the usual
        ``get_many(index)`` then ``put_many(index, ...)`` encodes it once."""
        last = self._last_index
        if last is not None and last[0] is keys:
            return last[1], last[2]
        encoded, pids = prepare_keys(keys, self.backend.partitions, self.backend.max_key_bytes, column)
        if isinstance(keys, pd.Index):
            self._last_index = (keys, encoded, pids)
        return encoded, pids

    def batch(self, state: str) -> Batch:
        if self._batch is None:
            raise InvalidInputError(f"state {state!r} is used outside handle_batch / handle_input_rows")
        return self._batch

    def begin(self, batch: Batch) -> None:
        self._batch, self._last_index = batch, None

    def prefetch(self, keys: list[bytes], pids: np.ndarray) -> None:
        """Read every value and list state of ``keys`` for the batch: one get_many per state."""
        for handle in self._handles.values():
            view = self._batch.view(handle.name, handle.kind)
            if isinstance(view, KeyedView):
                view.prefetch(keys, pids)

    def finish(self) -> None:
        """Write the batch back (one backend write) and close it."""
        batch, self._batch, self._last_index = self._batch, None, None
        batch.finish()


class StatefulProcessor(ABC):
    """Keyed stateful logic for ``transform_with_state``; implement ``init`` and one of the two handlers.

    ``handle_batch(self, batch: pandas.DataFrame) -> pandas.DataFrame | None``
        Vectorized: ``batch`` holds the rows of many keys (every row of a key
        that the task got in this micro-batch, unless they exceed the
        operator's ``max_batch_bytes``); use the handles' ``*_many`` methods.

    ``handle_input_rows(self, key: tuple, rows: Iterator[pandas.DataFrame]) -> Iterator[pandas.DataFrame | tuple]``
        Per key, like Spark's ``handleInputRows``: ``key`` is the tuple of the
        key columns' values, ``rows`` an iterator over one DataFrame of the
        key's rows; the handles' methods without keys act on this key. It
        yields DataFrames, as in Spark, or tuples: one output row each, in
        ``output_schema`` order, far cheaper than a one-row DataFrame.

    A processor is pickled to the executors; every task gets its own copy and
    calls ``init`` once, then the handler per batch (or key), then ``close``.
    """

    @abstractmethod
    def init(self, handle: StatefulProcessorHandle) -> None:
        """Get the state handles: ``handle.value_state(name)``, ``map_state``, ``list_state``."""

    def close(self) -> None:
        """Called when the task's input is done (also after a failure)."""
