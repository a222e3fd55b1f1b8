"""Exactly-once micro-batches: staged state writes, committed with the batch, checkpointed before Spark commits.

``exactly_once(sink, client=..., query=...)`` wraps a ``foreachBatch`` sink.
For micro-batch N it:

1. on the first batch of a run, brings the query's state to Spark's last
   committed batch (N-1): batches the state committed beyond it are rolled
   back (undo records), so a driver that died between committing state and
   Spark committing the batch loses nothing and repeats nothing;
2. runs the sink; every ``transform_with_state`` inside it *stages* its
   tasks' writes under (query, N, task, attempt) — a retried or speculative
   task replaces its attempt's stage — and reads committed state;
3. commits N on every partition (atomically per partition, idempotent);
4. takes checkpoint N (when the cluster has checkpoint storage), then
   returns, and only then does Spark commit the batch.

If a state node dies meanwhile, its partitions come back at the latest
checkpoint — N-1, taken in step 4 of the previous batch — without this
batch's stage or commit: the wrapper notices the ``partition_restored``
event (at any point up to and including checkpoint N), rolls the other
partitions back to N-1 and runs the batch again. A state older
than N-1 (a checkpoint had failed) cannot be repaired inside the run:
``StateRewoundError`` says which batch the state is at.

The sink must write idempotently by batch id (a re-run of batch N replaces
batch N's output): ``ParquetSink`` is one such sink.
"""

from __future__ import annotations

import contextvars
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from pyspark import TaskContext
from pyspark.sql import DataFrame

from ..errors import CheckpointsNotConfiguredError, RockstateError, StateRewoundError
from ..keys import partition_of
from ..serde import decode_value, encode_key, encode_value
from ..store import PUT, StateSpec
from .batch import BatchWriter
from .client import as_spec, backend_for

log = logging.getLogger(__name__)

TASKS_PER_OPERATOR = 1 << 20  # task ids of the n-th operator in a batch start at n * this
PIPELINES = "_pipelines"  # the state where each query's bookkeeping lives
HISTORY = 20


@dataclass
class Transaction:
    """The micro-batch being run on the driver; ``transform_with_state`` stages its writes under it."""

    query: str
    batch: int
    operators: int = 0
    counters: list = field(default_factory=list)  # Spark accumulators of rows in and out

    def next_operator(self) -> int:
        self.operators += 1
        return self.operators - 1


_current: contextvars.ContextVar[Transaction | None] = contextvars.ContextVar("rockstate_transaction", default=None)


def current_transaction() -> Transaction | None:
    return _current.get()


@dataclass(frozen=True)
class TaskStage:
    """What a task needs to stage its writes (pickled to executors)."""

    query: str
    batch: int
    operator: int


class StagingWriter(BatchWriter):
    """A task's writes staged under (query, batch, task, attempt) instead of written.

    Each flush is one more staged piece (``seq``); ``done`` marks the attempt
    whole once every piece is acknowledged, so only whole attempts commit.
    """

    def __init__(self, backend, stage: TaskStage) -> None:
        super().__init__(backend)
        context = TaskContext.get()
        self.stage = stage
        self.task = stage.operator * TASKS_PER_OPERATOR + (context.partitionId() if context else 0)
        self.attempt = context.attemptNumber() if context else 0
        self.seq = 0
        self.touched: set[int] = set()

    def flush(self) -> None:
        if self.ops:
            ops, self.ops = self.ops, {}
            self.backend.stage(self.stage.query, self.stage.batch, self.task, self.attempt, self.seq, ops)
            self.seq += 1
            self.touched.update(ops)

    def done(self) -> None:
        self.flush()
        if self.touched:
            self.backend.stage_done(self.stage.query, self.stage.batch, self.task, self.attempt, sorted(self.touched))


class ExactlyOnce:
    """The ``foreachBatch`` function returned by ``exactly_once``."""

    def __init__(self, sink: Callable[[DataFrame, int], Any], client: object, query: str, *,
                 checkpoint: bool = True, max_attempts: int = 5) -> None:
        if not isinstance(query, str) or not query:
            raise RockstateError("exactly_once needs query=<a name that stays the same across restarts>")
        self.sink, self.spec, self.query = sink, as_spec(client), query
        self.checkpoint, self.max_attempts = checkpoint, max_attempts
        self.recovered = False

    @property
    def backend(self):
        return backend_for(self.spec)

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        if not self.recovered:
            self.recover(batch_id)
            self.recovered = True
        for attempt in range(self.max_attempts):
            mark = self._last_event()
            txn = Transaction(self.query, batch_id)
            token = _current.set(txn)
            try:
                self.sink(df, batch_id)
            finally:
                _current.reset(token)
            committed = chk = None
            # a restore at any point up to checkpoint N took some partitions back to N-1 (or before this
            # batch's stage reached them): only a checkpoint N taken with no restore since the start counts
            if not self._restored_since(mark):
                self.backend.commit_batch(self.query, batch_id)
                committed = time.monotonic()
                if not self._restored_since(mark):
                    chk = self._checkpoint()
                    if not self._restored_since(mark):
                        break
            log.warning("query %s batch %s: state partitions were restored during the batch; running it again", self.query, batch_id)
            self._bring_to(batch_id - 1)
        else:
            raise RockstateError(f"query {self.query!r} batch {batch_id}: state nodes kept failing over {self.max_attempts} attempts")
        self._record(txn, batch_id, chk, committed - started, time.monotonic() - committed)

    # -- recovery ------------------------------------------------------------------

    def recover(self, batch_id: int) -> None:
        """First batch of a run: Spark has committed batch_id - 1; bring the state there."""
        self._bring_to(batch_id - 1)

    def _bring_to(self, last: int) -> None:
        committed = self.backend.committed_batches(self.query)
        values = list(committed.values())
        if all(v is None for v in values):
            return  # this query never committed state
        behind = sorted({v for v in values if v is None or v < last}, key=lambda v: -1 if v is None else v)
        if behind and last >= 0:
            raise StateRewoundError(
                f"query {self.query!r}: Spark committed batch {last} but some state partitions are at batch {behind[0]} "
                f"(restored from an older checkpoint); restore the cluster to the checkpoint of batch {behind[0]} and "
                f"restart the query from a Spark checkpoint of that batch",
                batch=behind[0],
            )
        if any(v is not None and v > last for v in values):
            undone = self.backend.rollback_batches(self.query, last if last >= 0 else None)
            log.info("query %s: rolled back %d batch commits beyond batch %d", self.query, undone, last)

    def _last_event(self) -> int:
        events = self.backend.events()
        return events[-1]["seq"] if events else 0

    def _restored_since(self, mark: int) -> bool:
        return any(e["event"] in ("partition_restored", "cluster_restored") for e in self.backend.events(mark))

    # -- checkpoint and bookkeeping -----------------------------------------------------

    def _checkpoint(self) -> int | None:
        """Checkpoint N, retried while it fails for a passing reason (a storage error aborted it).

        Returning without it would let Spark commit batch N while a node death
        could still take the state back before N, beyond what a re-run repairs.
        """
        if not self.checkpoint:
            return None
        backend = self.backend
        deadline = time.monotonic() + backend.retry_timeout
        for attempt in itertools.count():
            try:
                return backend.checkpointer.checkpoint().id
            except CheckpointsNotConfiguredError:
                self.checkpoint = False
                log.warning("query %s: the cluster has no checkpoint storage; a node death will lose state", self.query)
                return None
            except RockstateError as exc:
                if not exc.retryable or time.monotonic() > deadline:
                    raise
                log.warning("query %s: checkpoint failed (%s); trying again", self.query, exc)
                time.sleep(min(0.1 * 2 ** attempt, 2.0))

    def _record(self, txn: Transaction, batch_id: int, chk: int | None, run_s: float, checkpoint_s: float) -> None:
        """The query's bookkeeping, in the ``_pipelines`` state and the coordinator's status."""
        rows_in, rows_out = (int(c.value) for c in txn.counters[:2]) if txn.counters else (None, None)
        entry = {"batch": batch_id, "rows_in": rows_in, "rows_out": rows_out, "seconds": round(run_s, 4),
                 "checkpoint_seconds": round(checkpoint_s, 4), "checkpoint": chk, "time": time.time()}
        backend = self.backend
        backend.define_state(StateSpec(PIPELINES, "value"))
        key, pid = encode_key(self.query), partition_of(self.query, backend.partitions)
        old = backend.get_many(PIPELINES, {pid: [key]})[pid][0]
        record = decode_value(old) if old else {"query": self.query, "batches": []}
        record.update(last_batch=batch_id, last_checkpoint=chk, updated=entry["time"])
        record["batches"] = (record["batches"] + [entry])[-HISTORY:]
        backend.write({pid: [(PUT, PIPELINES, key, encode_value(record))]})
        backend.report_pipeline(record)


def exactly_once(sink: Callable[[DataFrame, int], Any], *, client: object, query: str, checkpoint: bool = True) -> ExactlyOnce:
    """Wrap a ``foreachBatch`` sink so the query's state changes exactly once per micro-batch (see the module doc).

    ``query``: a name that identifies the query across restarts (like its
    checkpoint location). ``checkpoint``: take checkpoint N after committing
    batch N (needed to survive a state node's death).
    """
    return ExactlyOnce(sink, client, query, checkpoint=checkpoint)


class ParquetSink:
    """A sink that writes each micro-batch's rows to ``<path>/batch_id=N/``, replacing what a re-run wrote."""

    def __init__(self, path: str) -> None:
        self.path = path.rstrip("/")

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        df.write.mode("overwrite").parquet(f"{self.path}/batch_id={batch_id}")
