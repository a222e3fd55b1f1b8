"""The user's side of the operator: ``StatefulProcessor`` and the handle its ``init`` gets.

The shape is Spark's ``transformWithStateInPandas`` with snake_case names:
``init(handle)``; ``handle_input_rows(key, rows, timer_values)``;
``handle_expired_timer(key, timer_values, expired_timer_info)``;
``handle_initial_state(key, initial_state, timer_values)``; ``close()``. The
handle gives states (``get_value_state(name, schema, ttl_duration_ms)``,
``get_list_state``, ``get_map_state``, ``delete_if_exists``) and timers
(``register_timer``, ``delete_timer``, ``list_timers``). Porting a Spark
processor is renaming; docs/spark.md lists every method side by side.

A processor may instead be vectorized: ``handle_batch(batch)`` gets a pandas
DataFrame of many keys' rows, and the handles take arrays of keys
(``get_many``, ``put_many``, ...; ``register_timers(keys, times)``), and
``handle_expired_timers(timers, timer_values)`` gets the expired timers as a
DataFrame.

Either way the operator reads state for a whole batch at once and writes it
back at the end of the batch in one request per owner (see ``batch``): the
handles never talk to the cluster per key. Per-key map-state reads and
``list_timers`` of a processor without ``handle_expired_timer`` are the
exceptions: a key's map is scanned, its timers read (one request), the first
time the batch reads them.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd

from ..errors import InvalidInputError, StateKindError, StateSchemaError, TimerModeError
from ..keys import partition_of
from ..serde import decode_value, encode_key, encode_value
from ..states import Backend, key_list, prepare_keys
from ..store.catalog import StateSpec, check_name
from .batch import Batch, KeyedView
from .client import define_state
from .clock import now_ms
from .handles import ListStateHandle, MapStateHandle, StateHandle, ValueStateHandle
from .timers import TimerView
from .values import StateCodec, check_evolution, struct_of

SCHEMAS = "_state_schemas"  # per state: kind, schemas, whether it has a TTL


def _ttl_ms(ttl: float | None, ttl_duration_ms: int | None) -> int | None:
    if ttl is not None and ttl_duration_ms is not None:
        raise InvalidInputError("give a state's TTL once: ttl (seconds) or ttl_duration_ms (Spark's milliseconds)")
    ms = ttl_duration_ms if ttl is None else ttl * 1000
    if ms is None:
        return None
    if isinstance(ms, bool) or not isinstance(ms, (int, float, np.number)) or ms <= 0:
        raise InvalidInputError(f"a state's TTL must be a positive number, got {ttl if ttl is not None else ttl_duration_ms!r}")
    return int(ms)


def _times(times: Any) -> list[int]:
    """Timer times as int milliseconds (ints, or datetime-like values)."""
    if isinstance(times, (pd.Series, pd.Index, np.ndarray)) and np.asarray(times).dtype.kind == "M":
        return (pd.to_datetime(np.asarray(times)).asi8 // 1_000_000).tolist()
    return [int(t) for t in key_list(times)]


class StatefulProcessorHandle:
    """What ``init`` gets: defines the processor's states and timers and gives their handles."""

    def __init__(self, backend: Backend, namespace: str = "", *, schemas: dict | None = None, clock=None,
                 time_mode: str = "none") -> None:
        """``namespace``: prefixed to every state name ("" for the names as given); ``schemas``: DDL strings parsed on
        the driver; ``clock``: the task's ``TaskClock``; ``time_mode``: the operator's ("none", "processingtime",
        "eventtime")."""
        self.backend, self.namespace, self.schemas = backend, namespace, {} if schemas is None else schemas
        self.clock, self.time_mode = clock, time_mode
        self.timer_state = self._full("_timers") if namespace else "_timers"
        self._handles: dict[str, StateHandle] = {}
        self._timers_defined = False
        self.deleted: set[str] = set()  # states delete_if_exists cleared: the task deletes them with its batch
        self._batch: Batch | None = None
        self._last_index: tuple[pd.Index, list[bytes], np.ndarray] | None = None

    @property
    def partitions(self) -> int:
        return self.backend.partitions

    def _full(self, name: str) -> str:
        return check_name(f"{self.namespace}.{name}", internal=True) if self.namespace else name

    def now_ms(self) -> int:
        """The batch's processing time (what TTLs count from)."""
        return now_ms() if self.clock is None else self.clock.processing_ms

    # -- states -------------------------------------------------------------

    def value_state(self, name: str, schema: Any = None, *, ttl: float | None = None, ttl_duration_ms: int | None = None) -> ValueStateHandle:
        """One value per key; ``schema``: a StructType or DDL string (None: any value); a TTL in seconds or Spark's ms."""
        return self._state(ValueStateHandle, name, schema, _ttl_ms(ttl, ttl_duration_ms))

    def list_state(self, name: str, schema: Any = None, *, ttl: float | None = None, ttl_duration_ms: int | None = None) -> ListStateHandle:
        return self._state(ListStateHandle, name, schema, _ttl_ms(ttl, ttl_duration_ms))

    def map_state(self, name: str, user_key_schema: Any = None, value_schema: Any = None, *, ttl: float | None = None,
                  ttl_duration_ms: int | None = None) -> MapStateHandle:
        return self._state(MapStateHandle, name, value_schema, _ttl_ms(ttl, ttl_duration_ms), user_key_schema)

    def get_value_state(self, state_name: str, schema: Any = None, ttl_duration_ms: int | None = None) -> ValueStateHandle:
        """Spark's ``getValueState(stateName, schema, ttlDurationMs)``."""
        return self.value_state(state_name, schema, ttl_duration_ms=ttl_duration_ms)

    def get_list_state(self, state_name: str, schema: Any = None, ttl_duration_ms: int | None = None) -> ListStateHandle:
        """Spark's ``getListState(stateName, schema, ttlDurationMs)``."""
        return self.list_state(state_name, schema, ttl_duration_ms=ttl_duration_ms)

    def get_map_state(self, state_name: str, user_key_schema: Any = None, value_schema: Any = None,
                      ttl_duration_ms: int | None = None) -> MapStateHandle:
        """Spark's ``getMapState(stateName, userKeySchema, valueSchema, ttlDurationMs)``."""
        return self.map_state(state_name, user_key_schema, value_schema, ttl_duration_ms=ttl_duration_ms)

    def delete_if_exists(self, state_name: str) -> None:
        """Delete every value of the state on this task's partitions, with the batch (Spark's ``deleteIfExists``)."""
        full = self._full(check_name(state_name))
        handle = self._handles.get(full)
        if handle is not None:
            handle.deleted = True
        self.deleted.add(full)

    def to_delete(self) -> list[str]:
        """The states ``delete_if_exists`` cleared (of those asked for): deleted with the batch."""
        return sorted(self.deleted & self._handles.keys())

    def _state(self, cls: type, name: str, schema: Any, ttl_ms: int | None, key_schema: Any = None) -> Any:
        full = self._full(check_name(name))
        what = f"state {name!r}"
        codec = StateCodec(full, struct_of(schema, self.schemas, what), ttl_ms, self.now_ms, self.backend.max_value_bytes,
                           struct_of(key_schema, self.schemas, what + " user key"))
        handle = self._handles.get(full)
        if handle is not None and not handle.deleted:
            old = handle.codec
            if handle.kind != cls.kind or (old.schema, old.key_schema, old.ttl_ms) != (codec.schema, codec.key_schema, codec.ttl_ms):
                raise StateKindError(f"state {name!r} is already a {handle!r}; it cannot be asked for again as another")
            return handle
        self.deleted.discard(full)
        handle = self._handles[full] = cls(self, define_state(self.backend, StateSpec(full, cls.kind)), codec)
        return handle

    def record_schemas(self) -> None:
        """Check each typed or TTL state against what it was created with (kind, schemas, TTL or not); record new ones.

        (An untyped state without a TTL has no record, and costs no request.)"""
        typed = {full: h for full, h in self._handles.items() if not h.codec.plain}
        if not typed:
            return
        backend = self.backend
        define_state(backend, StateSpec(SCHEMAS, "value"))
        wanted = {}
        for full, handle in typed.items():
            c = handle.codec
            wanted[full] = {"kind": handle.kind, "ttl": c.ttl_ms is not None,
                            "schema": c.schema and c.schema.json(), "key_schema": c.key_schema and c.key_schema.json()}
        by_pid: dict[int, list[str]] = {}
        for full in wanted:
            by_pid.setdefault(partition_of(full, backend.partitions), []).append(full)
        found = backend.get_many(SCHEMAS, {pid: [encode_key(n) for n in names] for pid, names in by_pid.items()})
        for pid, names in by_pid.items():
            for full, old in zip(names, found[pid]):
                new = wanted[full]
                if old is None or self._evolved(full, decode_value(old), new):
                    backend.compare_and_set(SCHEMAS, pid, encode_key(full), old, encode_value(new))

    @staticmethod
    def _evolved(state: str, stored: dict, new: dict) -> bool:
        """Whether ``new`` differs from ``stored`` in a way the stored values can follow; refuses any other change."""
        from pyspark.sql.types import StructType

        if stored == new:
            return False
        if stored["kind"] != new["kind"]:
            raise StateKindError(f"state {state!r} is a {stored['kind']} state; it cannot be used as a {new['kind']} state")
        if stored["ttl"] != new["ttl"]:
            raise StateSchemaError(f"state {state!r} was created {'with' if stored['ttl'] else 'without'} a TTL; a TTL can be "
                                   "changed but not added or removed: use a new state name", state=state)
        for part in ("schema", "key_schema"):
            old, now = stored[part], new[part]
            if (old is None) != (now is None):
                raise StateSchemaError(f"state {state!r} was created {'with' if old else 'without'} a schema; use a new state name", state=state)
            if old is not None and part == "key_schema" and old != now:
                raise StateSchemaError(f"the user key schema of map state {state!r} cannot change", state=state)
            if old is not None:
                check_evolution(state, StructType.fromJson(json.loads(old)), StructType.fromJson(json.loads(now)))
        return True

    @property
    def ttl_index(self) -> str:
        """The operator's index by expiry of its TTL states' entries (see ``expiry``), defined on first use."""
        name = self._full("_ttl") if self.namespace else "_ttl"
        define_state(self.backend, StateSpec(name, "value"))
        return name

    def ttl_handles(self) -> dict[str, StateHandle]:
        """The states with a TTL this run's ``init`` asked for, by full name."""
        return {full: h for full, h in self._handles.items() if h.codec.ttl_ms is not None and not h.deleted}

    # -- timers -------------------------------------------------------------

    def _timers(self) -> TimerView:
        if self.time_mode not in ("processingtime", "eventtime"):
            raise TimerModeError("timers need transform_with_state(..., time_mode='processingtime' or 'eventtime')")
        self.define_timers()
        return self.batch(self.timer_state).view(self.timer_state, "timers")

    def define_timers(self) -> None:
        if not self._timers_defined:
            define_state(self.backend, StateSpec(self.timer_state, "value"))
            self._timers_defined = True

    def register_timer(self, expiry_timestamp_ms: int) -> None:
        """A timer for the current key, firing in the first batch whose processing time (or watermark) reaches it."""
        view = self._timers()
        view.change(*map(list, zip(self.current_key("timers"))), [expiry_timestamp_ms], True)

    def delete_timer(self, expiry_timestamp_ms: int) -> None:
        view = self._timers()
        view.change(*map(list, zip(self.current_key("timers"))), [expiry_timestamp_ms], False)

    def list_timers(self) -> Iterator[int]:
        """The current key's timers, in time order."""
        view = self._timers()
        return iter(view.list(*self.current_key("timers")))

    def register_timers(self, keys: Any, times: Any) -> None:
        """Vectorized ``register_timer``: a timer at times[i] (ms, or datetime-like) for keys[i]."""
        self._change_timers(keys, times, True)

    def delete_timers(self, keys: Any, times: Any) -> None:
        self._change_timers(keys, times, False)

    def _change_timers(self, keys: Any, times: Any, on: bool) -> None:
        view = self._timers()
        encoded, pids = self.encode_keys(keys)
        times = _times(times)
        if len(times) != len(encoded):
            raise InvalidInputError(f"{len(encoded)} keys but {len(times)} timer times")
        view.change(encoded, pids.tolist(), times, on)

    # -- the batch ----------------------------------------------------------

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
            raise InvalidInputError(f"state {state!r} is used outside the processor's handlers")
        return self._batch

    def current_key(self, state: str) -> tuple[bytes, int]:
        current = self.batch(state).current
        if current is None:
            raise InvalidInputError(
                f"{state}: methods without keys act on the current key and work only inside handle_input_rows "
                "(and handle_expired_timer, handle_initial_state); in handle_batch pass the keys "
                "(get_many, put_many, register_timers, ...)"
            )
        return current

    def begin(self, batch: Batch) -> None:
        self._batch, self._last_index = batch, None

    def prefetch(self, keys: list[bytes], pids: np.ndarray, timers: bool = False) -> None:
        """Read every value and list state of ``keys`` for the batch, and their timers if asked: one get_many per state."""
        if timers:
            self._timers().prefetch(keys, pids.tolist())
        for name, handle in self._handles.items():
            if handle.deleted:
                continue
            view = self._batch.view(name, handle.kind)
            if isinstance(view, KeyedView):
                view.prefetch(keys, pids)

    def finish(self) -> None:
        """Write the batch back (one backend write) and close it."""
        batch, self._batch, self._last_index = self._batch, None, None
        batch.finish()


class StatefulProcessor(ABC):
    """Keyed stateful logic for ``transform_with_state``: ``init`` and one of two handlers, per key or vectorized.

    Per key, as Spark's ``transformWithStateInPandas``:

    ``handle_input_rows(self, key, rows, timer_values) -> Iterator[DataFrame | tuple]``
        ``key`` is the tuple of the key columns' values, ``rows`` an iterator
        over one DataFrame of the key's rows in this micro-batch (``timer_values``
        may be left out of the signature). The handles' methods without keys
        act on this key. Yields DataFrames, as in Spark, or tuples: one output
        row each, in ``output_schema`` order, far cheaper than a one-row DataFrame.
    ``handle_expired_timer(self, key, timer_values, expired_timer_info)`` (optional)
        Called for each timer that fired, after the batch's rows; yields rows the same way.
    ``handle_initial_state(self, key, initial_state, timer_values)`` (optional)
        Called in the query's first batch for each key of ``initial_state=``.

    Vectorized:

    ``handle_batch(self, batch) -> DataFrame | None``
        ``batch`` holds the rows of many keys (every row of a key that the
        task got in this micro-batch, unless they exceed the operator's
        ``max_batch_bytes``); use the handles' ``*_many`` methods.
    ``handle_expired_timers(self, timers, timer_values) -> DataFrame | None`` (optional)
        ``timers``: the key columns and ``expiry_time_ms``, one row per fired timer.
    ``handle_initial_state(self, initial_state, timer_values)`` (optional)
        ``initial_state``: the initial-state rows of the task's keys.

    A processor is pickled to the executors; every task gets its own copy and
    calls ``init`` once, then the handlers, then ``close``. The operator also
    calls ``init`` once on the driver (as Spark does), to learn the states' schemas.
    """

    @abstractmethod
    def init(self, handle: StatefulProcessorHandle) -> None:
        """Get the state handles: ``handle.get_value_state(name, schema)``, ``get_list_state``, ``get_map_state``."""

    def close(self) -> None:
        """Called when the task's input is done (also after a failure)."""
