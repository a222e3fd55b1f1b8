"""A query's state visible to outside readers once Spark commits each batch: a listener on the driver.

Batch N's version is applied when batch N + 1 starts (``microbatch``), so
without more a reader outside the query lags a batch, and the last batch of
a stopped query waits for its restart. Spark posts a query's progress event
for batch N after committing N; ``BatchListener``, a Python
``StreamingQueryListener`` (PySpark 3.4+) on the driver, then does what
``settle`` does: it advances the query's state to N + 1. It acts only on a
batch rockstate sealed (the seal marker on partition 0: every seal marks
every partition), so other queries of the session pass untouched, and an
unsealed batch is never applied. It also reports a plain
``transform_with_state`` query's batch as a pipeline (``pipelines``), as
``exactly_once`` reports its own.

``transform_with_state`` registers it (once per session) on a classic
driver: on the DataFrame's session for the operator on a stream (the session
that starts the query); inside ``foreachBatch`` on the application's first
session (the batch's DataFrame has a clone of the query's session, which
does not see the query's events). ``exactly_once`` tells it the name its operators stage
under. Progress events are asynchronous: the state is visible shortly after
the batch commits, not at ``awaitTermination``'s return.

Not covered — ``settle(query, client)`` remains for them: Spark Connect (the
operator is built on a client without the driver's Python), a query started
from another session than these, and a reader that must see the last batch
at once rather than shortly after.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable

import msgpack
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQueryListener

from ..store.staging import META, sealed_key
from .client import StateClientSpec, backend_for, is_open
from .microbatch import QUERY_ID
from .pipelines import record_batch

log = logging.getLogger(__name__)


class BatchListener(StreamingQueryListener):
    """Advances each committed batch of a rockstate query on every cluster the session's operators use.

    Each cluster has a thread of its own (``_Cluster``): Spark's listener bus is never held up, and a cluster
    that stopped answering (its calls wait out the client's ``retry_timeout``) holds up no other."""

    def __init__(self) -> None:
        super().__init__()
        self.clusters: dict[StateClientSpec, _Cluster] = {}
        self.names: dict[str, str] = {}  # Spark query id -> the exactly_once name its operators stage under
        self.lock = threading.Lock()

    def watch(self, spec: StateClientSpec) -> None:
        with self.lock:
            if spec not in self.clusters:
                self.clusters[spec] = _Cluster(spec, self._forget)

    def onQueryStarted(self, event) -> None:
        pass

    def onQueryProgress(self, event) -> None:
        p = event.progress
        query_id = str(p.id)
        with self.lock:
            clusters, name = list(self.clusters.values()), self.names.get(query_id)
        committed = Committed(query_id, name, p.batchId, p.name, p.numInputRows, (p.durationMs or {}).get("triggerExecution", 0))
        for cluster in clusters:
            cluster.queue.put(committed)

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        pass

    def _forget(self, spec: StateClientSpec) -> None:
        with self.lock:
            self.clusters.pop(spec, None)


@dataclass(frozen=True)
class Committed:
    """What the listener keeps of a progress event: batch ``batch`` of Spark query ``query_id`` is committed."""

    query_id: str
    name: str | None  # exactly_once's
    batch: int
    query_name: str | None
    rows_in: int
    trigger_ms: int


class _Cluster:
    """One cluster's thread: applies each committed batch of a rockstate query there, in order."""

    def __init__(self, spec: StateClientSpec, forget: Callable[[StateClientSpec], None]) -> None:
        self.spec, self.forget = spec, forget
        self.queue: queue.SimpleQueue[Committed] = queue.SimpleQueue()
        threading.Thread(target=self._run, name=f"rockstate-batches-{spec.address}", daemon=True).start()

    def _run(self) -> None:
        while True:
            c = self.queue.get()
            if not is_open(self.spec):  # close_clients() closed it: the program is done with that cluster
                return self.forget(self.spec)
            try:
                self._committed(c)
            except Exception as exc:  # the next batch (or settle) applies it
                log.warning("query %s batch %s: could not apply the committed batch's state on %s (the next batch or "
                            "settle() applies it; not listening for that cluster until an operator is built for it "
                            "again): %s", c.query_id, c.batch, self.spec.address, exc)
                return self.forget(self.spec)  # each event would wait out the client's retry_timeout again

    def _committed(self, c: Committed) -> None:
        backend = backend_for(self.spec)
        staged_as = c.name or c.query_id
        marker = backend.get_many(META, {0: [sealed_key(staged_as)]})[0][0]
        if marker is None or msgpack.unpackb(marker) < c.batch:
            return  # not a rockstate query on this cluster, or its batch N sealed nothing
        backend.advance_batches(staged_as, c.batch + 1)
        if c.name is None:  # exactly_once reports its own batches
            record_batch(backend, c.query_id, {
                "batch": c.batch, "rows_in": c.rows_in, "rows_out": None, "seconds": round(c.trigger_ms / 1000, 4),
                "checkpoint_seconds": None, "checkpoint": None, "time": time.time()},
                id=c.query_id, name=c.query_name, last_checkpoint=None)


_listeners: dict[int, tuple[SparkSession, BatchListener]] = {}  # id(session) -> (session kept alive, its listener)
_lock = threading.Lock()


def watch_batches(df, spec: StateClientSpec, *, name: str | None = None) -> None:
    """Make the batches of ``df``'s streaming query visible as Spark commits them (see the module doc).

    ``df``: a streaming DataFrame, or a ``foreachBatch`` batch (anything else, and Spark Connect: nothing to do);
    ``name``: the ``exactly_once`` name its operators stage under."""
    session = df.sparkSession
    try:
        context = session.sparkContext
    except Exception:  # Spark Connect: no SparkContext, no driver-side Python listener; settle() it is
        return
    if not df.isStreaming:
        query_id = context.getLocalProperty(QUERY_ID)
        if not query_id:
            return  # a batch job: no query, no progress
        session = getattr(SparkSession, "_instantiatedSession", None) or session
    with _lock:
        _, listener = _listeners.get(id(session), (None, None))
        if listener is None:
            listener = BatchListener()
            try:
                session.streams.addListener(listener)
            except Exception as exc:  # the state still applies as the next batch starts, or by settle()
                log.warning("could not register rockstate's batch listener on the driver (settle() applies the "
                            "last batch): %s", exc)
                return
            _listeners[id(session)] = (session, listener)
    backend_for(spec)  # open: the listener leaves a cluster alone once close_clients() closed it
    listener.watch(spec)
    if name is not None and not df.isStreaming:
        with listener.lock:
            listener.names[query_id] = name
