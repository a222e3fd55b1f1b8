"""A pipeline's bookkeeping: each committed micro-batch, in the ``_pipelines`` state and the coordinator's status.

``exactly_once`` records each batch it ran (rows through its operators, its
checkpoint); the driver's listener (``listener``) records each batch of a
plain ``transform_with_state`` query from Spark's progress. Both keep the
last ``HISTORY`` batches per query in the cluster, so a restarted driver
goes on with them, and report the record to the coordinator (the status,
its page and ``rockstate status --output json`` list it under pipelines).
"""

from __future__ import annotations

import time

from ..keys import partition_of
from ..serde import decode_value, encode_key, encode_value
from ..store import PUT, StateSpec
from .client import define_state

PIPELINES = "_pipelines"  # the state where each query's bookkeeping lives
HISTORY = 20


def record_batch(backend, query: str, entry: dict, known: dict | None = None, **fields) -> dict:
    """Add ``entry`` (a batch: ``batch``, rows, seconds, ...) to ``query``'s record, store and report it; returns it.

    ``known``: the record as this caller last returned it (the only writer of this query's record), which saves
    reading it. ``fields``: more of the record's own fields (``last_checkpoint``, the Spark query's ``id`` and
    ``name``)."""
    entry = {**entry, "time": entry.get("time", time.time())}
    define_state(backend, StateSpec(PIPELINES, "value"))
    key, pid = encode_key(query), partition_of(query, backend.partitions)
    if known is not None:
        record = {**known, "batches": list(known["batches"])}
    else:
        old = backend.get_many(PIPELINES, {pid: [key]})[pid][0]
        record = decode_value(old) if old else {"query": query, "batches": []}
    record.update(fields, last_batch=entry["batch"], updated=entry["time"])
    record["batches"] = (record["batches"] + [entry])[-HISTORY:]
    backend.write({pid: [(PUT, PIPELINES, key, encode_value(record))]})
    backend.report_pipeline(record)
    return record
