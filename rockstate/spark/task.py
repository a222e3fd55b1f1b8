"""One Spark task of ``transform_with_state``: the processor over the task's rows, timers and initial state.

A task serves a fixed set of rockstate partitions (the operator routes every
row of a partition to one task, see ``partitioning.route_by_owner``), rows
or no rows. In rounds, each one processor ``Batch`` (state read in bulk,
writes flushed, or staged as the micro-batch's version, at its end, and only
then its output yielded):

1. before the input: the states ``init`` deleted (``delete_if_exists``), and in
   the query's first batch the initial state of the task's keys (``initial``);
2. the input, in sorted chunks of whole keys (``chunks``): late rows dropped
   first in event time (``clock``), then ``handle_batch`` or
   ``handle_input_rows`` per key;
3. after the input, as Spark: the timers of the task's partitions that the
   batch's processing time (or watermark) reached (``timers``), each handed to
   ``handle_expired_timer`` (``handle_expired_timers`` vectorized) and
   deleted; and the event time the task saw, kept for the next batch's
   watermark.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from ..errors import InvalidInputError, UnsupportedShapeError
from ..ops import DELETE_PREFIX
from ..serde import decode_key, encode_keys
from .compat import to_arrow_schema
from . import expiry
from .batch import Batch, BatchWriter
from .chunks import chunks
from .client import StateClientSpec, backend_for
from .clock import TaskClock
from .initial import delete_initial_state, read_initial_state
from .microbatch import BatchTask, MicroBatch, Sealing
from .partitioning import PARTITION_COLUMN
from .processor import StatefulProcessor, StatefulProcessorHandle
from .timers import ExpiredTimerInfo

_cleaned: set[str] = set()  # initial states this worker process already removed after batch 0


class Output:
    """What the handlers returned for one round: DataFrames, and rows given as tuples.

    A tuple is one output row in ``output_schema`` order: far cheaper to make
    than the one-row DataFrame a per-key handler would otherwise yield.
    """

    def __init__(self, schema: T.StructType) -> None:
        self.schema, self.arrow_schema = schema, to_arrow_schema(schema)
        self.frames: list[pd.DataFrame] = []
        self.rows: list[tuple] = []

    def add(self, result) -> None:
        """A handler's result: a DataFrame, None, or an iterable of DataFrames and tuples."""
        if result is None:
            return
        if isinstance(result, pd.DataFrame):
            self.frames.append(result)
            return
        for item in result:
            if isinstance(item, tuple):
                self.rows.append(item)
            elif isinstance(item, pd.DataFrame):
                self.frames.append(item)
            elif item is not None:
                raise InvalidInputError(f"a handler yielded a {type(item).__name__}; yield pandas DataFrames or tuples (rows)")

    def batches(self) -> Iterator[pa.RecordBatch]:
        names, schema = self.arrow_schema.names, self.arrow_schema
        if self.rows:
            if any(len(row) != len(names) for row in self.rows):
                raise InvalidInputError(f"a yielded row does not have the {len(names)} fields of output_schema {self.schema.simpleString()}")
            columns = zip(*self.rows)
            yield pa.RecordBatch.from_arrays([pa.array(c, type=f.type) for c, f in zip(columns, schema)], schema=schema)
        frames = [f for f in self.frames if not f.empty]
        if frames:
            out = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
            missing = [name for name in names if name not in out.columns]
            if missing:
                raise InvalidInputError(f"the processor's output lacks columns {missing} of output_schema {self.schema.simpleString()}")
            # through a Table: pandas 3's string columns are Arrow-backed, chunked, which RecordBatch.from_pandas refuses
            yield from pa.Table.from_pandas(out[names], schema=schema, preserve_index=False).combine_chunks().to_batches()


@dataclass(frozen=True)
class Plan:
    """What every task of one operator needs besides the processor (pickled with the task)."""

    keys: tuple[str, ...]
    schema: T.StructType
    max_batch_bytes: int
    operator: str
    namespace: str | None  # None: the query and operator
    streaming: bool
    task_pids: tuple[tuple[int, ...], ...]  # per Spark task, the rockstate partitions it serves
    time_mode: str = "none"
    event_time_column: str | None = None
    watermark_delay_ms: int = 0
    schemas: dict = field(default_factory=dict)  # DDL strings the processor's init uses, parsed on the driver
    initial_state: tuple[str, tuple[str, ...]] | None = None  # (internal state, columns)
    timezone: str = "UTC"  # the session's, for timestamps handed to pandas
    ttl: bool = False  # the processor has states with a TTL: each task cleans its partitions' expired entries

    @property
    def markers(self) -> bool:
        """Whether every task must learn its partitions, rows or not (see ``partitioning.with_markers``)."""
        return self.time_mode != "none" or self.initial_state is not None or self.ttl


def _mode(processor: object) -> str:
    if not isinstance(processor, StatefulProcessor):
        raise InvalidInputError(f"processor must be a rockstate.spark.StatefulProcessor, got {type(processor).__name__}")
    modes = [m for m in ("handle_batch", "handle_input_rows") if callable(getattr(processor, m, None))]
    if len(modes) != 1:
        raise InvalidInputError(
            f"{type(processor).__name__} must implement exactly one of handle_batch and handle_input_rows, has {modes or 'neither'}"
        )
    return modes[0]


class TaskRunner:
    """The function ``mapInArrow`` runs in every task; pickled to the executors with the processor."""

    def __init__(self, spec: StateClientSpec, processor: StatefulProcessor, plan: Plan, micro: MicroBatch | None,
                 counters: list | None, sealing: Sealing | None) -> None:
        """``micro``: inside exactly_once, its batch (None: the task's own, if any); ``counters``: Spark accumulators
        of rows in and out; ``sealing``: how the tasks seal a batch (None: exactly_once does it on the driver)."""
        self.spec, self.processor, self.plan = spec, processor, plan
        self.micro, self.counters, self.sealing = micro, counters, sealing
        self.mode = _mode(processor)
        handler = getattr(processor, self.mode)
        self.takes_timer_values = self.mode == "handle_input_rows" and len(inspect.signature(handler).parameters) >= 3
        # a per-key processor with timer handlers reads (lists, moves) its keys' timers: read them with their state
        self.timers = (plan.time_mode != "none" and self.mode == "handle_input_rows"
                       and callable(getattr(processor, "handle_expired_timer", None)))

    @property
    def keys(self) -> list[str]:
        return list(self.plan.keys)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        plan, backend = self.plan, backend_for(self.spec)
        micro = self.micro or MicroBatch.of_task()
        if micro is None and plan.streaming:
            raise UnsupportedShapeError(
                "transform_with_state ran in a streaming task without a micro-batch id (a continuous trigger?): "
                "its state could not be versioned by batch; use a micro-batch trigger (processingTime, availableNow)"
            )
        task = None if micro is None else BatchTask(backend, micro, plan.operator, self.sealing)
        namespace = plan.namespace
        if namespace is None:
            namespace = "" if micro is None else f"{micro.query}.{plan.operator}"
        clock = TaskClock(backend, micro, plan.time_mode, f"{namespace}._event_time" if namespace else "_event_time",
                          plan.watermark_delay_ms)
        handle = StatefulProcessorHandle(backend, namespace, schemas=plan.schemas, clock=clock, time_mode=plan.time_mode)
        self.processor.init(handle)
        handle.record_schemas()
        if plan.time_mode != "none":
            handle.define_timers()
        batches, pids = self._partitions(batches, backend.partitions)
        # in a micro-batch the task's writes are staged, so its later rounds read them from memory (keep)
        staged = None if task is None else Batch(backend, task.writer, keep=True)
        rounds = Rounds(handle, lambda: staged or Batch(backend, BatchWriter(backend)), plan.schema)
        timer_values = clock.timer_values()
        try:
            yield from rounds.run(lambda batch, out: self._start(handle, batch, out, pids, micro, timer_values))
            if plan.event_time_column:
                batches = (clock.drop_late(b, plan.event_time_column) for b in batches)
            vectorized = self.mode == "handle_batch"
            for table, starts in chunks(batches, PARTITION_COLUMN, self.keys, plan.max_batch_bytes, groups=not vectorized):
                rounds.rows_in += table.num_rows
                if vectorized:
                    work = lambda batch, out, t=table: out.add(self.processor.handle_batch(self._pandas(t)))
                else:
                    work = lambda batch, out, t=table, s=starts: self._per_key(handle, batch, t, s, out, timer_values)
                yield from rounds.run(work)
            yield from rounds.run(lambda batch, out: self._end(handle, batch, out, pids, clock, timer_values))
            if task is not None:
                task.finish()
            if self.counters:
                self.counters[0].add(rounds.rows_in)
                self.counters[1].add(rounds.rows_out)
        finally:
            self.processor.close()

    def _pandas(self, table: pa.Table) -> pd.DataFrame:
        """The rows as Spark hands them to pandas: timestamps as naive datetime64[ns] in the session's time zone."""
        frame = table.drop_columns([PARTITION_COLUMN]).to_pandas(coerce_temporal_nanoseconds=True)
        for name, dtype in frame.dtypes.items():
            if isinstance(dtype, pd.DatetimeTZDtype):
                frame[name] = frame[name].dt.tz_convert(self.plan.timezone).dt.tz_localize(None)
        return frame

    def _partitions(self, batches: Iterator[pa.RecordBatch], partitions: int) -> tuple[Iterator[pa.RecordBatch], list[int]]:
        """The input without its markers, and the rockstate partitions this task serves (none known: no markers came)."""
        if not self.plan.markers:
            return batches, []
        batches = list(batches)  # a task's share of one micro-batch
        pids: list[int] = []
        kept = []
        for batch in batches:
            column = batch.column(PARTITION_COLUMN)
            markers = pc.greater_equal(column, partitions)
            if pc.any(markers).as_py():
                task = pc.min(pc.filter(column, markers)).as_py() - partitions
                pids = list(self.plan.task_pids[task])
                batch = batch.filter(pc.invert(markers))
            kept.append(batch)
        return iter(kept), pids

    # -- the rounds ---------------------------------------------------------

    def _start(self, handle, batch: Batch, output: Output, pids: list[int], micro, timer_values) -> None:
        """Before the input: ``delete_if_exists``, then the initial state (in the query's first batch)."""
        for state in handle.to_delete():
            for pid in pids:
                batch.writer.add(pid, (DELETE_PREFIX, state, b"", None))
        if self.plan.initial_state is None:
            return
        state, columns = self.plan.initial_state
        if micro is not None and micro.batch > 0:
            if state not in _cleaned:  # a restarted query wrote it again; batch 0 is long applied
                for pid in pids:
                    if handle.backend.scan(state, pid, b"", None, 1):
                        handle.backend.write({pid: [(DELETE_PREFIX, state, b"", None)]})
                _cleaned.add(state)
            return
        found = list(read_initial_state(handle.backend, state, pids, columns))
        if not found:
            return
        handler = getattr(self.processor, "handle_initial_state", None)
        if handler is None:
            raise InvalidInputError(f"{type(self.processor).__name__} got an initial_state but has no handle_initial_state")
        handle.prefetch([k for k, *_ in found], np.array([p for _, p, *_ in found], dtype=np.int64), self.timers)
        if self.mode == "handle_batch":
            handler(pd.concat([rows for *_, rows in found], ignore_index=True), timer_values)
        else:
            for key, pid, key_tuple, rows in found:
                batch.current = (key, pid)
                handler(key_tuple, rows, timer_values)
            batch.current = None
        by_pid: dict[int, list[bytes]] = {}
        for key, pid, *_ in found:
            by_pid.setdefault(pid, []).append(key)
        delete_initial_state(batch.writer, state, by_pid)

    def _per_key(self, handle, batch: Batch, table: pa.Table, starts: np.ndarray, output: Output, timer_values) -> None:
        """Prefetch every key's state with one get_many per state, then call the processor key by key."""
        firsts = table.take(starts)
        key_tuples = list(zip(*(firsts.column(k).to_pylist() for k in self.keys)))
        state_keys = [k[0] for k in key_tuples] if len(self.keys) == 1 else key_tuples
        encoded = encode_keys(state_keys, handle.backend.max_key_bytes)
        pids = firsts.column(PARTITION_COLUMN).to_numpy().astype(np.int64)
        handle.prefetch(encoded, pids, self.timers)
        rows = self._pandas(table)
        ends = [*starts[1:].tolist(), table.num_rows]
        handler = self.processor.handle_input_rows
        extra = (timer_values,) if self.takes_timer_values else ()
        for key, data, pid, start, end in zip(key_tuples, encoded, pids.tolist(), starts.tolist(), ends):
            group = rows.iloc[start:end]
            group.index = pd.RangeIndex(end - start)  # each key's rows numbered from 0, as in Spark
            batch.current = (data, pid)
            output.add(handler(key, iter([group]), *extra))
        batch.current = None

    def _end(self, handle, batch: Batch, output: Output, pids: list[int], clock: TaskClock, timer_values) -> None:
        """After the input: fire the expired timers of the task's partitions, delete their expired TTL entries;
        keep the event time seen."""
        bound = clock.timer_bound()
        per_key = getattr(self.processor, "handle_expired_timer", None)
        vectorized = getattr(self.processor, "handle_expired_timers", None)
        if bound is not None and (per_key or vectorized) and pids:
            view = batch.view(handle.timer_state, "timers")
            expired = view.expired(pids, bound)
            if expired:
                keys = [decode_key(k) for k in expired.keys]
                key_tuples = [k if isinstance(k, tuple) else (k,) for k in keys]
                if self.mode == "handle_batch" and vectorized:
                    timers = pd.DataFrame(key_tuples, columns=self.keys)
                    timers["expiry_time_ms"] = expired.times
                    output.add(vectorized(timers, timer_values))
                else:
                    handle.prefetch(expired.keys, expired.pids, True)
                    for (ms, key, pid), key_tuple in zip(expired, key_tuples):
                        batch.current = (key, pid)
                        output.add(per_key(key_tuple, timer_values, ExpiredTimerInfo(ms)))
                    batch.current = None
                view.fire(expired, bound)
        if pids and handle.ttl_handles():
            expiry.clean(handle, batch, pids, handle.now_ms())
        clock.record(batch.writer, pids[0] if pids else None)


class Rounds:
    """Runs one round of processor work over a fresh ``Batch`` and yields its output once its state is written."""

    def __init__(self, handle: StatefulProcessorHandle, new_batch: Callable[[], Batch], schema: T.StructType) -> None:
        self.handle, self.new_batch, self.schema = handle, new_batch, schema
        self.rows_in = self.rows_out = 0

    def run(self, work: Callable[[Batch, Output], None]) -> Iterator[pa.RecordBatch]:
        batch, output = self.new_batch(), Output(self.schema)
        self.handle.begin(batch)
        work(batch, output)
        self.handle.finish()  # state first: the output below depends on it
        for out in output.batches():
            self.rows_out += out.num_rows
            yield out
