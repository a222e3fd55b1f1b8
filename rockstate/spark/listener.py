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
import threading
import time

import msgpack
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQueryListener

from ..store.staging import META, sealed_key
from .client import StateClientSpec, backend_for, is_open
from .microbatch import QUERY_ID
from .pipelines import record_batch

log = logging.getLogger(__name__)


class BatchListener(StreamingQueryListener):
    """Advances each committed batch of a rockstate query on every cluster the session's operators use."""

    def __init__(self) -> None:
        super().__init__()
        self.specs: set[StateClientSpec] = set()
        self.names: dict[str, str] = {}  # Spark query id -> the exactly_once name its operators stage under
        self.lock = threading.Lock()

    def onQueryStarted(self, event) -> None:
        pass

    def onQueryProgress(self, event) -> None:
        progress = event.progress
        query_id = str(progress.id)
        with self.lock:
            specs, name = list(self.specs), self.names.get(query_id)
        for spec in specs:
            if not is_open(spec):  # close_clients() closed it: the program is done with that cluster
                self._forget(spec)
                continue
            try:
                self._committed(spec, progress, query_id, name)
            except Exception as exc:  # never into Spark's listener bus; the next batch (or settle) applies it
                log.warning("query %s batch %s: could not apply the committed batch's state on %s (the next batch or "
                            "settle() applies it; not listening for that cluster until an operator is built for it "
                            "again): %s", query_id, progress.batchId, spec.address, exc)
                self._forget(spec)  # each event would wait out the client's retry_timeout again

    def _forget(self, spec: StateClientSpec) -> None:
        with self.lock:
            self.specs.discard(spec)

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        pass

    def _committed(self, spec: StateClientSpec, progress, query_id: str, name: str | None) -> None:
        backend, batch = backend_for(spec), progress.batchId
        staged_as = name or query_id
        marker = backend.get_many(META, {0: [sealed_key(staged_as)]})[0][0]
        if marker is None or msgpack.unpackb(marker) < batch:
            return  # not a rockstate query on this cluster, or its batch N sealed nothing
        backend.advance_batches(staged_as, batch + 1)
        if name is None:  # exactly_once reports its own batches
            durations = progress.durationMs or {}
            record_batch(backend, query_id, {
                "batch": batch, "rows_in": progress.numInputRows, "rows_out": None,
                "seconds": round(durations.get("triggerExecution", 0) / 1000, 4), "checkpoint_seconds": None,
                "checkpoint": None, "time": time.time()}, id=query_id, name=progress.name, last_checkpoint=None)


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
    with listener.lock:
        listener.specs.add(spec)
        if name is not None and not df.isStreaming:
            listener.names[query_id] = name
