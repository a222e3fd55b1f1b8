"""The demo's pipeline: materialize a CDC stream, keeping the latest sequence number per key in rockstate."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..spark import ParquetSink, StatefulProcessor, transform_with_state

INPUT_SCHEMA = "id bigint, seq bigint, op string, name string, amount double"
OUTPUT_SCHEMA = INPUT_SCHEMA
STATE = "cdc-latest-seq"


class LatestBySeq(StatefulProcessor):
    """Drops stale and duplicate events: an event passes only if its seq is above the key's stored seq."""

    def init(self, handle) -> None:
        self.latest = handle.value_state(STATE)

    def handle_batch(self, batch: pd.DataFrame) -> pd.DataFrame:
        newest = batch.sort_values("seq", kind="stable").drop_duplicates("id", keep="last")
        stored = np.asarray(self.latest.get_many(newest["id"], default=0))
        passed = newest[newest["seq"].to_numpy() > stored]
        self.latest.put_many(passed["id"], passed["seq"])
        return passed


def materialize(batch_df, client, output_dir: str, batch_id: int) -> None:
    """One micro-batch: the events that change the table, written idempotently by batch id."""
    changes = transform_with_state(batch_df, "id", LatestBySeq(), OUTPUT_SCHEMA, client)
    ParquetSink(output_dir)(changes, batch_id)


def read_table(output_dir: str) -> tuple[pd.DataFrame, int]:
    """The materialized table (each key's last change, unless a delete) and the number of change rows."""
    import pyarrow.dataset as ds

    changes = ds.dataset(output_dir, format="parquet", partitioning="hive").to_table().to_pandas()
    latest = changes.sort_values(["id", "seq"]).drop_duplicates("id", keep="last")
    live = latest[latest.op != "delete"]
    table = live[["id", "seq", "name", "amount"]].sort_values("id").reset_index(drop=True)
    return table, len(changes)
