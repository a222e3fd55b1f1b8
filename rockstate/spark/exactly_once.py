"""``exactly_once``: a ``foreachBatch`` sink whose micro-batches ride out a state node's death.

Every ``transform_with_state`` in a streaming query keeps its state exactly
once by itself (see ``microbatch``): batch N reads the state batches < N
left and stages N's version, applied once Spark has committed N. Its own
answer to a state node dying during a batch is to fail the query, whose
restart runs the batch again. ``exactly_once(sink, client=..., query=...)``
does better for a ``foreachBatch`` sink; for micro-batch N it:

1. runs the sink; every ``transform_with_state`` inside it stages its
   writes as batch N of ``query`` (a name that stays the same across
   restarts, which also scopes the operators' states);
2. seals N on every partition and takes checkpoint N (when the cluster has
   checkpoint storage and no synchronous backups: with backups the seal,
   once acknowledged, survives a node's death without a checkpoint; then
   every ``checkpoint_every`` batches, for losing every replica and for
   savepoints), then returns, and only then does Spark commit the batch;
3. if a state partition was restored meanwhile (its node died), it came
   back at checkpoint N-1, without N's stage: the wrapper notices the
   ``partition_restored`` event (at any point up to and including
   checkpoint N) and runs the batch again at once — the re-run replaces N's
   version everywhere.

The sink must write idempotently by batch id (a re-run of batch N replaces
batch N's output): ``ParquetSink`` is one such sink.
"""

from __future__ import annotations

import contextvars
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from pyspark.sql import DataFrame

from ..errors import CheckpointsNotConfiguredError, ConfigError, RockstateError
from .client import as_spec, backend_for
from .listener import watch_batches
from .microbatch import per_batch_checkpoint, settle, take_checkpoint
from .pipelines import record_batch

log = logging.getLogger(__name__)


@dataclass
class Transaction:
    """The micro-batch being run on the driver; ``transform_with_state`` stages its writes under it."""

    query: str
    batch: int
    operators: list = field(default_factory=list)  # names of the operators built in the batch
    counters: list | None = None  # Spark accumulators of rows in and out (None under Spark Connect)


_current: contextvars.ContextVar[Transaction | None] = contextvars.ContextVar("rockstate_transaction", default=None)


def current_transaction() -> Transaction | None:
    return _current.get()


class ExactlyOnce:
    """The ``foreachBatch`` function returned by ``exactly_once``."""

    def __init__(self, sink: Callable[[DataFrame, int], Any], client: object, query: str, *,
                 checkpoint: bool | None = None, checkpoint_every: int | None = None, max_attempts: int = 5) -> None:
        if not isinstance(query, str) or not query:
            raise RockstateError("exactly_once needs query=<a name that stays the same across restarts>")
        if checkpoint_every is not None and (isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int)
                                             or checkpoint_every < 1):
            raise ConfigError(f"exactly_once(checkpoint_every={checkpoint_every!r}): give a number of micro-batches >= 1, or None")
        self.sink, self.spec, self.query = sink, as_spec(client), query
        self.checkpoint, self.checkpoint_every, self.max_attempts = checkpoint, checkpoint_every, max_attempts
        self._seen: int | None = None  # the last cluster event seen: the next batch's mark
        self._record_kept: dict | None = None  # the query's record as last written (this sink is its only writer)

    @property
    def backend(self):
        return backend_for(self.spec)

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        watch_batches(df, self.spec, name=self.query)  # the state visible as Spark commits the batch
        for attempt in range(self.max_attempts):
            mark = self._last_event()
            txn = Transaction(self.query, batch_id)
            token = _current.set(txn)
            try:
                self.sink(df, batch_id)
            finally:
                _current.reset(token)
            chk = sealed = None
            # a restore at any point up to checkpoint N took some partitions back to N-1 (or before this
            # batch's stage reached them): only a checkpoint N taken with no restore since the start counts
            if not self._restored_since(mark):
                for operator in txn.operators or [""]:
                    self.backend.seal(self.query, batch_id, operator)
                sealed = time.monotonic()
                chk = self._checkpoint(batch_id)
                if not self._restored_since(mark):
                    break
            log.warning("query %s batch %s: state partitions were restored during the batch; running it again", self.query, batch_id)
        else:
            raise RockstateError(f"query {self.query!r} batch {batch_id}: state nodes kept failing over {self.max_attempts} attempts")
        self._record(txn, batch_id, chk, sealed - started, time.monotonic() - sealed)

    def settle(self, query) -> int | None:
        """``rockstate.spark.settle`` for this sink's operators: apply now what the ``StreamingQuery`` finished."""
        return settle(query, self.spec, name=self.query)

    def _last_event(self) -> int:
        """The mark a batch checks restores from: the last event the previous batch's checks saw (asked of the
        coordinator once). A restore between two batches thus makes the next one run again: redundant, never wrong."""
        if self._seen is None:
            events = self.backend.events()
            self._seen = events[-1]["seq"] if events else 0
        return self._seen

    def _restored_since(self, mark: int) -> bool:
        events = self.backend.events(mark)
        if events:
            self._seen = max(self._seen or 0, events[-1]["seq"])
        return any(e["event"] in ("partition_restored", "cluster_restored") for e in events)

    # -- checkpoint and bookkeeping -----------------------------------------------------

    def _checkpoint(self, batch_id: int) -> int | None:
        """Checkpoint N, retried while it fails for a passing reason (a storage error aborted it).

        Returning without it would let Spark commit batch N while a node death
        could still take the state back before N, beyond what a re-run repairs.
        """
        every = self.checkpoint_every
        if not per_batch_checkpoint(self.backend, self.checkpoint) and not (every and batch_id % every == 0):
            return None
        try:
            return take_checkpoint(self.backend)
        except CheckpointsNotConfiguredError:
            self.checkpoint, self.checkpoint_every = False, None
            log.warning("query %s: the cluster has no checkpoint storage; a node death will lose state", self.query)
            return None

    def _record(self, txn: Transaction, batch_id: int, chk: int | None, run_s: float, checkpoint_s: float) -> None:
        """The query's bookkeeping, in the ``_pipelines`` state and the coordinator's status."""
        rows_in, rows_out = (int(c.value) for c in txn.counters) if txn.counters else (None, None)
        self._record_kept = record_batch(self.backend, self.query, {
            "batch": batch_id, "rows_in": rows_in, "rows_out": rows_out, "seconds": round(run_s, 4),
            "checkpoint_seconds": round(checkpoint_s, 4), "checkpoint": chk}, self._record_kept, last_checkpoint=chk)


def exactly_once(sink: Callable[[DataFrame, int], Any], *, client: object, query: str,
                 checkpoint: bool | None = None, checkpoint_every: int | None = None) -> ExactlyOnce:
    """Wrap a ``foreachBatch`` sink so the query's state changes exactly once per micro-batch (see the module doc).

    ``query``: a name that identifies the query across restarts (like its
    checkpoint location). ``checkpoint``: take checkpoint N after committing
    batch N. Needed to survive a state node's death without backups; None
    (the default): only when the cluster has no synchronous backups (with
    them a node's death loses no acknowledged commit). ``checkpoint_every``:
    when that per-batch checkpoint is off, take one after every this many
    micro-batches all the same (batch ids divisible by it): the point to
    restore to if every replica of a partition is lost, and a savepoint;
    None (the default): none (the coordinator's periodic checkpoints, if
    configured, remain).
    """
    return ExactlyOnce(sink, client, query, checkpoint=checkpoint, checkpoint_every=checkpoint_every)


class ParquetSink:
    """A sink that writes each micro-batch's rows to ``<path>/batch_id=N/``, replacing what a re-run wrote."""

    def __init__(self, path: str) -> None:
        self.path = path.rstrip("/")

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        df.write.mode("overwrite").parquet(f"{self.path}/batch_id={batch_id}")
