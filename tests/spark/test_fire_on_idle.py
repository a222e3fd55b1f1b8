"""Timers of a streaming query that gets no more input: fire_on_idle makes every triggered micro-batch fire them."""

import sys
import threading
import time
import uuid
from collections import defaultdict

import pandas as pd
from pyspark import cloudpickle

from rockstate.spark import StatefulProcessor, transform_with_state

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors cannot import the tests

GAP_MS = 1_000


class Sessions(StatefulProcessor):
    """Counts a key's events; a processing-time timer GAP_MS after its last batch closes the session."""

    def init(self, handle):
        self.handle = handle
        self.events = handle.get_value_state("events", "n bigint")

    def handle_input_rows(self, key, rows, timer_values):
        n = (self.events.get()[0] if self.events.exists() else 0) + sum(len(pdf) for pdf in rows)
        self.events.update((n,))
        self.handle.register_timer(timer_values.get_current_processing_time_in_ms() + GAP_MS)
        return iter([])

    def handle_expired_timer(self, key, timer_values, expired_timer_info):
        n = self.events.get()[0]
        self.events.clear()
        yield pd.DataFrame({"session": [key[0]], "events": [n]})


def test_timers_fire_in_batches_without_input_with_fire_on_idle(spark, cluster, tmp_path):
    sessions = [f"session-{uuid.UUID(int=i)}" for i in range(3)]
    (tmp_path / "in").mkdir()
    pd.DataFrame({"session": [s for i, s in enumerate(sessions) for _ in range(i + 1)]}).to_json(
        tmp_path / "in" / "events.json", orient="records", lines=True)
    source = spark.readStream.schema("session string").json(str(tmp_path / "in"))
    out = transform_with_state(source, "session", Sessions(), "session string, events bigint", cluster.address,
                               time_mode="processingtime", fire_on_idle=True)
    seen: dict[int, list] = defaultdict(list)
    closed = threading.Event()

    def collect(batch_df, batch_id):
        seen[batch_id].extend((r.session, r.events) for r in batch_df.collect())
        if sum(len(rows) for rows in seen.values()) >= len(sessions):
            closed.set()

    query = (out.writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "chk"))
             .trigger(processingTime="1 second").start())
    try:
        deadline = time.monotonic() + 300
        while not closed.wait(0.5) and query.isActive and time.monotonic() < deadline:
            pass
        assert query.exception() is None, query.exception()
        assert closed.is_set(), f"the sessions did not close in 300 s: {dict(seen)}, last progress {query.lastProgress}"
    finally:
        query.stop()
    assert sorted(r for rows in seen.values() for r in rows) == [(s, i + 1) for i, s in enumerate(sessions)]
    # the only file is batch 0's input, and the timers are GAP_MS after it: they fired in batches without input
    assert not seen.get(0) and all(batch > 0 for batch, rows in seen.items() if rows)
