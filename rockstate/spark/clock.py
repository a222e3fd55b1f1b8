"""A micro-batch's clocks: its processing time, and the watermark the operator keeps.

**Processing time.** Spark fixes a batch's timestamp when it plans the batch
and runs a re-run of the batch with the same one; timers, TTL and
``TimerValues`` must see one time per batch too, or a re-run would fire other
timers than the attempt it replaces. A Python task cannot read Spark's, so
the first task of (query, batch) to ask fixes it in the cluster (a
compare-and-set on the query's clock record) and every other task and every
re-run of the batch reads that. Outside a streaming query it is the task's
start time.

**Watermark** (``time_mode="eventtime"``). Spark does not hand a
``mapInArrow`` task the query's watermark, so the operator keeps its own with
Spark's rules: batch N's watermark (what timers fire by and ``TimerValues``
show, Spark's "eviction" watermark) is the largest event time of the batches
before N minus the delay, never going back (0 before any event); rows at or
before batch N-1's watermark (Spark's "late events" watermark) are dropped as
late. Each task stages, with the batch's writes, on the first partition it
serves: the largest event time it has seen, the late rows it dropped, and
the batch's watermark; a batch reads them from every partition.
"""

from __future__ import annotations

import time
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..keys import partition_of
from ..ops import PUT
from ..serde import decode_value, encode_key, encode_value
from ..store.catalog import StateSpec
from .client import define_state

CLOCKS = "_batch_clocks"
EVENT_KEY = b"max_event_time"
MODES = ("none", "processingtime", "eventtime")


def now_ms() -> int:
    return int(time.time() * 1000)


def batch_timestamp(backend, query: str, batch: int) -> int:
    """The processing time of ``batch`` of ``query``, fixed by whoever asks first."""
    define_state(backend, StateSpec(CLOCKS, "value"))
    key, pid = encode_key(query), partition_of(query, backend.partitions)
    while True:
        old = backend.get_many(CLOCKS, {pid: [key]})[pid][0]
        if old is not None:
            seen, ms = decode_value(old)
            if seen == batch:
                return ms
            if seen > batch:  # an older batch run again: Spark would not; keep its time monotonic
                return ms
        ms = now_ms()
        if backend.compare_and_set(CLOCKS, pid, key, old, encode_value([batch, ms])):
            return ms


def event_ms(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Event times as int64 milliseconds (a timestamp column of any unit, or a long of milliseconds)."""
    if pa.types.is_timestamp(column.type):
        column = pc.cast(column, pa.timestamp("ms", column.type.tz), safe=False).cast(pa.int64())
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int64)


class TaskClock:
    """One task's clocks for its batch, read lazily (a processor that uses neither costs nothing)."""

    def __init__(self, backend, micro, mode: str, event_state: str | None, delay_ms: int) -> None:
        self.backend, self.micro, self.mode = backend, micro, mode
        self.event_state, self.delay_ms = event_state, delay_ms
        self.max_event: int | None = None  # the largest event time this task saw
        self.late = 0  # rows this task dropped as late

    @cached_property
    def processing_ms(self) -> int:
        if self.micro is None:
            return now_ms()
        return batch_timestamp(self.backend, self.micro.query, self.micro.batch)

    @cached_property
    def _events(self) -> dict[int, list]:
        """The event-time record of every partition: [largest event time, late rows dropped, the batch's watermark]."""
        backend = self.backend
        define_state(backend, StateSpec(self.event_state, "value"))
        found = backend.get_many(self.event_state, {pid: [EVENT_KEY] for pid in range(backend.partitions)})
        return {pid: decode_value(v[0]) for pid, v in found.items() if v[0] is not None}

    @cached_property
    def late_watermark_ms(self) -> int:
        """The watermark of the batch before: rows at or before it are late."""
        return max((r[2] for r in self._events.values()), default=0)

    @cached_property
    def watermark_ms(self) -> int:
        if self.mode != "eventtime":
            return -1
        seen = [r[0] for r in self._events.values() if r[0] is not None]
        return max(self.late_watermark_ms, max(seen) - self.delay_ms if seen else 0)

    def timer_values(self):
        from .timers import TimerValues

        if self.mode == "none":
            return TimerValues(-1, -1)
        return TimerValues(lambda: self.processing_ms, lambda: self.watermark_ms)

    def timer_bound(self) -> int | None:
        """Timers at or before this fire in the batch (None: no timers in this mode)."""
        if self.mode == "processingtime":
            return self.processing_ms
        if self.mode == "eventtime":
            return self.watermark_ms
        return None

    def drop_late(self, table: pa.Table, column: str) -> pa.Table:
        """``table`` without the late rows; notes the largest event time."""
        times = event_ms(table.column(column))
        if len(times):
            top = int(times.max())
            self.max_event = top if self.max_event is None else max(self.max_event, top)
        late = times <= self.late_watermark_ms
        if not late.any():
            return table
        self.late += int(late.sum())
        return table.filter(pa.array(~late))

    def record(self, writer, pid: int | None) -> None:
        """Stage the task's largest event time, late rows and the batch's watermark with the batch, on partition ``pid``."""
        if pid is None or self.mode != "eventtime":
            return
        top, late, _ = self._events.get(pid, [None, 0, 0])
        if self.max_event is not None:
            top = self.max_event if top is None else max(top, self.max_event)
        writer.add(pid, (PUT, self.event_state, EVENT_KEY, encode_value([top, late + self.late, self.watermark_ms])))


def late_rows(backend, event_state: str) -> int:
    """Rows an event-time operator dropped as late, over every applied batch."""
    define_state(backend, StateSpec(event_state, "value"))
    found = backend.get_many(event_state, {pid: [EVENT_KEY] for pid in range(backend.partitions)})
    return sum(decode_value(v[0])[1] for v in found.values() if v[0] is not None)
