"""A processor's state handles: value, list and map state, vectorized and for the current key.

Each handle has two sets of methods. The ``*_many`` ones take arrays of keys
(and values) and answer in order: what ``handle_batch`` uses. The others act
on the current key of ``handle_input_rows`` (or of a timer or initial-state
handler), with Spark's names in snake_case: ``exists``, ``get``, ``update``,
``clear``; ``append_value``, ``append_list``, ``put``; ``get_value``,
``contains_key``, ``update_value``, ``remove_key``, ``iterator``, ``keys``,
``values``. A ``StateCodec`` (``values``) turns values into bytes and back:
typed by a schema or not, with Spark's TTL or not.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from ..errors import InvalidInputError
from ..serde import decode_key, encode_key
from ..states import batch_columns, key_list
from ..store.catalog import StateSpec
from .values import StateCodec


def _same_length(what: str, keys: list, other: list) -> None:
    if len(keys) != len(other):
        raise InvalidInputError(f"{what}: {len(keys)} keys but {len(other)} values")


class StateHandle:
    kind = ""

    def __init__(self, owner, spec: StateSpec, codec: StateCodec) -> None:
        self.name, self.spec, self.codec, self._owner = spec.name, spec, codec, owner
        self.deleted = False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} schema={self.codec.schema} ttl_ms={self.codec.ttl_ms}>"

    def _view(self) -> Any:
        if self.deleted:
            raise InvalidInputError(f"state {self.name!r} was deleted by delete_if_exists in init(); ask for it again to use it")
        view = self._owner.batch(self.name).view(self.name, self.kind)
        if self.codec.ttl_ms is not None and view.ttl is None:  # its writes go to the index by expiry too (``expiry``)
            view.ttl = (self._owner.ttl_index, self.codec.clock() + self.codec.ttl_ms)
        return view

    def _keys(self, keys: Any) -> tuple[list[bytes], np.ndarray]:
        return self._owner.encode_keys(keys)

    def _current(self) -> tuple[bytes, int]:
        return self._owner.current_key(self.name)


class ValueStateHandle(StateHandle):
    """One value per key."""

    kind = "value"

    def get_many(self, keys: Any, default: Any = None) -> list[Any]:
        encoded, pids = self._keys(keys)
        return self.codec.decode_many(self._view().read(encoded, pids), default)

    def put_many(self, keys: Any, values: Any = None) -> None:
        """``put_many(keys, values)``, ``put_many(mapping)`` or ``put_many(pairs)``, as on a plain state."""
        keys, column, values = batch_columns(keys, values)
        encoded, pids = self._owner.encode_keys(keys, column)
        self._view().write_columns(encoded, pids, self.codec.encode_many(values, column))

    def delete_many(self, keys: Any) -> None:
        encoded, pids = self._keys(keys)
        self._view().write_columns(encoded, pids, None)

    # -- the current key --

    def exists(self) -> bool:
        return self.get() is not None

    def get(self, default: Any = None) -> Any:
        """The key's value (a Row for a typed state), or ``default`` (None, as in Spark) when there is none."""
        value = self.codec.decode(self._view().get(*self._current()))
        return default if value is None else value

    def update(self, value: Any) -> None:
        key, pid = self._current()
        self._view().write([key], [pid], [self.codec.encode(value)])

    def clear(self) -> None:
        key, pid = self._current()
        self._view().write([key], [pid], [None])


class ListStateHandle(StateHandle):
    """A list of values per key."""

    kind = "list"

    def get_many(self, keys: Any) -> list[list[Any]]:
        encoded, pids = self._keys(keys)
        return [self.codec.decode_list(v) for v in self._view().read(encoded, pids)]

    def put_many(self, keys: Any, lists: Any) -> None:
        """Replace each key's list (an empty list deletes it)."""
        encoded, pids = self._keys(keys)
        lists = key_list(lists)
        _same_length("put_many", encoded, lists)
        data = [b"".join(self.codec.encode_many(key_list(items))) or None for items in lists]
        self._view().write(encoded, pids.tolist(), data)

    def append_many(self, keys: Any, values: Any) -> None:
        """Append values[i] to the list of keys[i], in order (a key may repeat)."""
        encoded, pids = self._keys(keys)
        values = self.codec.encode_many(key_list(values))
        _same_length("append_many", encoded, values)
        first = dict(zip(encoded, range(len(encoded))))  # distinct keys, each with one of its rows
        rows = list(first.values())
        lists = dict(zip(first, map(self.codec.live_list, self._view().read(list(first), pids[rows]))))
        for key, value in zip(encoded, values):
            lists[key] += value
        self._view().write(list(lists), pids[rows].tolist(), list(lists.values()))

    def delete_many(self, keys: Any) -> None:
        encoded, pids = self._keys(keys)
        self._view().write(encoded, pids.tolist(), [None] * len(encoded))

    # -- the current key --

    def _stored(self) -> bytes:
        return self._view().get(*self._current()) or b""

    def exists(self) -> bool:
        return bool(self.codec.decode_list(self._stored()))

    def get(self) -> Iterator[Any]:
        return iter(self.codec.decode_list(self._stored()))

    def put(self, values: Iterable[Any]) -> None:
        key, pid = self._current()
        self._view().write([key], [pid], [b"".join(self.codec.encode_many(values)) or None])

    def append_value(self, value: Any) -> None:
        self.append_list([value])

    def append_list(self, values: Iterable[Any]) -> None:
        key, pid = self._current()
        data = self.codec.live_list(self._stored()) + b"".join(self.codec.encode_many(values))
        self._view().write([key], [pid], [data or None])

    def clear(self) -> None:
        key, pid = self._current()
        self._view().write([key], [pid], [None])


class MapStateHandle(StateHandle):
    """A map of user keys to values per key."""

    kind = "map"

    def _user_key(self, user_key: Any) -> bytes:
        return encode_key(self.codec.user_key(user_key), self._owner.backend.max_key_bytes)

    def _user_keys(self, user_keys: Any, n: int) -> list[bytes]:
        encoded = [self._user_key(uk) for uk in key_list(user_keys)]
        if len(encoded) != n:
            raise InvalidInputError(f"map state {self.name!r}: {n} keys but {len(encoded)} user keys")
        return encoded

    def get_many(self, keys: Any, user_keys: Any, default: Any = None) -> list[Any]:
        encoded, pids = self._keys(keys)
        return self.codec.decode_many(self._view().read(encoded, pids, self._user_keys(user_keys, len(encoded))), default)

    def put_many(self, keys: Any, user_keys: Any, values: Any) -> None:
        encoded, pids = self._keys(keys)
        values = self.codec.encode_many(key_list(values))
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

    # -- the current key --

    def _live(self) -> list[tuple[bytes, Any]]:
        decode = self.codec.decode
        entries = ((uk, decode(v)) for uk, v in sorted(self._view().entries(*self._current()).items()))
        return [(uk, v) for uk, v in entries if v is not None]

    def exists(self) -> bool:
        return bool(self._live())

    def get_value(self, user_key: Any, default: Any = None) -> Any:
        value = self.codec.decode(self._view().get(*self._current(), self._user_key(user_key)))
        return default if value is None else value

    def contains_key(self, user_key: Any) -> bool:
        return self.get_value(user_key) is not None

    def update_value(self, user_key: Any, value: Any) -> None:
        key, pid = self._current()
        self._view().write([key], [pid], [self._user_key(user_key)], [self.codec.encode(value)])

    def remove_key(self, user_key: Any) -> None:
        key, pid = self._current()
        self._view().write([key], [pid], [self._user_key(user_key)], [None])

    def iterator(self) -> Iterator[tuple[Any, Any]]:
        """(user key, value) pairs in the order of the user keys' encodings."""
        out = self.codec.user_key_out
        return iter([(out(decode_key(uk)), v) for uk, v in self._live()])

    def keys(self) -> Iterator[Any]:
        return (uk for uk, _ in self.iterator())

    def values(self) -> Iterator[Any]:
        return (v for _, v in self.iterator())

    def clear(self) -> None:
        key, pid = self._current()
        self._view().clear([key], [pid])
