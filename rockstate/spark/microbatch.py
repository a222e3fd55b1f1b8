"""A Spark task's part in a micro-batch: the state as of the batch before, writes staged as the batch's version.

Every task of a streaming query carries Spark's own task properties
``sql.streaming.queryId`` and ``streaming.sql.batchId`` — wherever the
operator sits in the plan: built on the streaming DataFrame with any sink,
then ``foreachBatch``, or inside ``foreachBatch``. So the task itself knows
(query, N), and the state is versioned by N (see ``store/staging.py``):

1. ``BatchTask`` first advances every partition to N (applies the staged
   batches below N: Spark committed them before starting N);
2. the processor reads that state; its writes are staged under (query, N,
   operator, attempt) by ``StagingWriter``, and the task reads its own
   writes from memory (``Batch(keep=True)``);
3. at the end the attempt is marked done on every partition it staged on
   (the node checks every piece is there).

Batch N's stages must outlive a state node's death until N is applied, so
they must be in a checkpoint before Spark commits N. Inside ``exactly_once``
the driver takes it. Otherwise (any sink) the operator's tasks count
themselves on two partitions of different nodes (``finish_task``); the task
that completes the count *seals* the batch: it checks that every partition
the tasks staged on holds a done attempt (a partition restored during the
batch lost them), marks every partition sealed through N, takes a
checkpoint (without synchronous backups), and checks again if it took one
or a partition was restored since the task started. If something was
lost, the batch is marked
failed, so this task and its retries fail, the query stops with
``StateRewoundError``, and its restart runs batch N again from Spark's
checkpoint — with the same input, replacing N's version.
"""

from __future__ import annotations

import logging
import secrets
import warnings
from collections import Counter
from dataclasses import dataclass

from pyspark import TaskContext

from ..errors import CheckpointsNotConfiguredError, StageIncompleteError, StateAheadError, StateRewoundError
from ..retry import Retry
from .batch import BatchWriter

log = logging.getLogger(__name__)

QUERY_ID, BATCH_ID, RUN_ID = "sql.streaming.queryId", "streaming.sql.batchId", "spark.jobGroup.id"
CHECKPOINT_RETRY = Retry(deadline=None, initial=0.1, maximum=2.0)  # the deadline is the backend's retry_timeout


@dataclass(frozen=True)
class MicroBatch:
    """(query, batch) of the running task, from Spark's task properties; ``run`` tells a restarted query apart."""

    query: str
    batch: int
    run: str

    @classmethod
    def of_task(cls) -> MicroBatch | None:
        """None outside a streaming query (a batch job's task)."""
        context = TaskContext.get()
        if context is None:
            return None
        query, batch = context.getLocalProperty(QUERY_ID), context.getLocalProperty(BATCH_ID)
        if not query or batch is None:
            return None
        return cls(query, int(batch), context.getLocalProperty(RUN_ID) or "")


@dataclass(frozen=True)
class Sealing:
    """How the operator's tasks seal a batch themselves (pickled with the task): how many tasks the operator
    has, and the partitions (of two nodes when there are two) where they count themselves."""

    tasks: int
    records: tuple[int, ...]


class StagingWriter(BatchWriter):
    """A task attempt's writes staged under (query, batch, operator, attempt); ``done`` marks the attempt whole."""

    def __init__(self, backend, micro: MicroBatch, operator: str) -> None:
        super().__init__(backend)
        self.micro, self.operator = micro, operator
        self.attempt = secrets.randbits(63)  # unique across retries, speculative copies and query restarts
        self.seq = 0
        self.pieces: Counter[int] = Counter()  # partition -> pieces staged on it

    def flush(self) -> None:
        if self.ops:
            ops, self.ops = self.ops, {}
            self.backend.stage(self.micro.query, self.micro.batch, self.operator, self.attempt, self.seq, ops)
            self.seq += 1
            self.pieces.update(ops.keys())

    def done(self) -> None:
        self.flush()
        if self.pieces:
            self.backend.stage_done(self.micro.query, self.micro.batch, self.operator, self.attempt, dict(self.pieces))


class BatchTask:
    """One task of micro-batch N: state advanced to N, writes staged, and the batch sealed by its last task."""

    def __init__(self, backend, micro: MicroBatch, operator: str, sealing: Sealing | None) -> None:
        self.backend, self.micro, self.operator, self.sealing = backend, micro, operator, sealing
        self.mark = last_event(backend)  # before advancing: a restore after it may have rewound what the task reads
        ahead = {pid: a for pid, a in backend.advance_batches(micro.query, micro.batch).items() if a is not None and a >= micro.batch}
        if ahead:
            raise StateAheadError(
                f"Spark is running batch {micro.batch} of query {micro.query} but the state already applied batch "
                f"{max(ahead.values())} on partitions {sorted(ahead)[:8]}: the query's checkpoint location was rewound "
                "or copied; restore the cluster to a checkpoint of that batch, or start the query with a new checkpoint location"
            )
        self.writer = StagingWriter(backend, micro, operator)

    def finish(self) -> None:
        """The task's input is done: mark its attempt done, count the task, and seal the batch if it is the last."""
        self.writer.flush()
        restores = self._restores()
        if restores:
            # a restored partition is back at the last seal, before this batch's advance: what the task read
            # from it since may be older than the batch before, so this attempt must not count
            raise StageIncompleteError(
                f"query {self.micro.query} batch {self.micro.batch}: state partitions were restored while the task ran "
                f"({sorted({e.get('partition') for e in restores}, key=str)[:8]}); the task must run again")
        self.writer.done()
        if self.sealing is None:
            return  # exactly_once seals the batch on the driver
        m, context = self.micro, TaskContext.get()
        records = self.backend.finish_task(m.query, m.batch, self.operator, m.run, context.partitionId(), self.sealing.tasks,
                                           sorted(self.writer.pieces), list(self.sealing.records)).values()
        failed = next((r[2] for r in records if r[2]), None)
        if failed:
            raise StateRewoundError(failed, batch=m.batch)
        if any(r[0] for r in records):
            self._seal(sorted({pid for r in records for pid in r[1]}))

    def _seal(self, staged_on: list[int]) -> None:
        m = self.micro
        lost = self._lost(staged_on)
        if not lost and (self._checkpoint() or self._restores()):
            # again: a partition restored before the checkpoint was taken, or since this task started (without a
            # checkpoint, a look at the cluster's events is enough to tell, and costs one request, not a seal)
            lost = self._lost(staged_on)
        if lost:
            why = (f"query {m.query} batch {m.batch}: state partitions {lost[:8]} were restored while the batch ran and "
                   "lost its staged writes; restart the query: Spark runs the batch again and its state is replaced")
            self.backend.finish_task(m.query, m.batch, self.operator, m.run, TaskContext.get().partitionId(), self.sealing.tasks,
                                     [], list(self.sealing.records), failed=why)
            raise StateRewoundError(why, batch=m.batch)

    def _lost(self, staged_on: list[int]) -> list[int]:
        """Partitions the batch's tasks staged on that no longer hold a done attempt; seals every partition."""
        has = self.backend.seal(self.micro.query, self.micro.batch, self.operator)
        return [pid for pid in staged_on if not has[pid]]

    def _restores(self) -> list[dict]:
        """The restores since the task started."""
        return [e for e in self.backend.events(self.mark) if e["event"] in ("partition_restored", "cluster_restored")]

    def _checkpoint(self) -> bool:
        """Take checkpoint N if the cluster needs one per batch; whether one was taken."""
        if not per_batch_checkpoint(self.backend):
            return False
        try:
            take_checkpoint(self.backend)
            return True
        except CheckpointsNotConfiguredError:
            log.warning("the cluster has no checkpoint storage: a state node's death will lose state")
            return False


def last_event(backend) -> int:
    events = backend.events()
    return events[-1]["seq"] if events else 0


def per_batch_checkpoint(backend, wanted: bool | None = None) -> bool:
    """Whether batch N is checkpointed before Spark commits it: ``wanted``; by default (None) only on a cluster
    without synchronous backups. With them a node's death loses no acknowledged seal or commit (its partitions'
    backups are promoted, nothing rewinds); periodic checkpoints remain for losing every replica, and savepoints."""
    if wanted is not None:
        return wanted
    table = getattr(backend, "table", None)
    return not (table is not None and table.backup_count > 0 and table.replication == "sync")


def take_checkpoint(backend) -> int:
    """A checkpoint of the whole cluster, retried while it fails for a passing reason, up to the backend's retry_timeout."""
    return CHECKPOINT_RETRY.replace(deadline=backend.retry_timeout).call(lambda: backend.checkpointer.checkpoint().id)


def last_finished_batch(query) -> int | None:
    """The last batch a ``StreamingQuery`` ran to its end: Spark reports a batch's progress after committing it."""
    ran = [_field(p, "batchId") for p in query.recentProgress if "addBatch" in (_field(p, "durationMs") or {})]
    return max(ran, default=None)


def _field(progress, name: str):
    return getattr(progress, name, None) if not isinstance(progress, dict) else progress.get(name)


def settle(query, client, *, name: str | None = None) -> int | None:
    """Apply now the state of every batch the query finished; returns the last one (None: none yet).

    A batch's version is applied when the next batch starts; the last batch of
    a query that stopped waits for its restart. Call this to read the state
    from outside as the query left it. ``query``: the ``StreamingQuery``;
    ``name``: the ``exactly_once`` query name, if the operators ran inside one.
    """
    from .client import as_spec, backend_for

    last = last_finished_batch(query)
    if last is not None:
        backend_for(as_spec(client)).advance_batches(name or str(query.id), last + 1)
    return last


class WeakerGuaranteeWarning(UserWarning):
    """The operator runs where its state changes at least once, not exactly once."""


def warn_if_outside_a_stream(df) -> None:
    """Warn when ``df`` is a batch DataFrame outside a streaming query: its tasks write directly."""
    if df.isStreaming:
        return
    try:
        inside = df.sparkSession.sparkContext.getLocalProperty(BATCH_ID) is not None
    except Exception:  # Spark Connect: no SparkContext on the client, so the driver cannot tell
        inside = None
    if inside:
        return
    warnings.warn(WeakerGuaranteeWarning(
        "transform_with_state on a batch DataFrame outside a streaming query writes state directly: a task that Spark "
        "retries writes again, so state changes at least once, not exactly once"
        + (" (inside a streaming query's foreachBatch it is exactly once)" if inside is None else "")
        + "; run it in a streaming query for exactly once"), stacklevel=3)
