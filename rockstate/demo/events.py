"""The demo's change-data-capture stream: insert / update / delete events with duplicates and disorder.

Each primary key gets a life of events with increasing sequence numbers
(insert, some updates, maybe a delete, maybe a re-insert). Delivery is
at-least-once and out of order, as CDC connectors deliver: some events are
sent twice, and events are shuffled within a window before being cut into
files. ``ground_truth`` computes the expected table straight from the
events, independently of the pipeline.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd

COLUMNS = ["id", "seq", "op", "name", "amount"]


def generate(events: int, seed: int = 7) -> pd.DataFrame:
    """About ``events`` CDC events (before duplicates) over events/5 primary keys, in delivery order."""
    rng = np.random.default_rng(seed)
    keys = max(1, events // 5)
    per_key = rng.poisson(4, keys) + 1
    ids = np.repeat(np.arange(keys, dtype=np.int64), per_key)
    seq = np.concatenate([np.arange(1, n + 1) for n in per_key]).astype(np.int64)
    ops = rng.choice(np.array(["update", "delete"]), len(ids), p=[0.85, 0.15]).astype(object)
    first = seq == 1
    ops[first] = "insert"
    after_delete = np.zeros(len(ids), dtype=bool)
    after_delete[1:] = (ops[:-1] == "delete") & ~first[1:]
    ops[after_delete] = "insert"  # a key deleted and then inserted again
    frame = pd.DataFrame({
        "id": ids, "seq": seq, "op": ops,
        "name": [f"customer-{i}" for i in ids],
        "amount": np.round(rng.uniform(1, 1000, len(ids)), 2),
    })
    frame.loc[frame.op == "delete", ["name", "amount"]] = [None, np.nan]
    # at-least-once delivery: ~5% sent twice
    frame = pd.concat([frame, frame.sample(frac=0.05, random_state=seed)], ignore_index=True)
    # roughly in commit order across keys, with a key's events overtaking each other,
    # then shuffled within windows of ~200 events
    frame["t"] = frame["seq"] + rng.uniform(0, 3, len(frame))
    frame = frame.sort_values(["t"], kind="stable").reset_index(drop=True)
    window = np.arange(len(frame)) // 200
    frame = frame.iloc[np.lexsort((rng.random(len(frame)), window))].reset_index(drop=True)
    return frame[COLUMNS]


def chunk(frame: pd.DataFrame, files: int, i: int) -> pd.DataFrame:
    """The i-th of ``files`` consecutive pieces of the stream."""
    bounds = np.linspace(0, len(frame), files + 1).astype(int)
    return frame.iloc[bounds[i]:bounds[i + 1]]


def write_file(part: pd.DataFrame, directory: str, i: int) -> None:
    """One JSON-lines file, appearing whole (the file source must not read it half-written)."""
    path = os.path.join(directory, f"cdc-{i:04d}.json")
    tmp = os.path.join(directory, f".cdc-{i:04d}.json.tmp")
    with open(tmp, "w") as f:
        for row in part.to_dict("records"):
            # a missing value is null in JSON: pandas gives NaN for a missing amount, and for a missing name too
            # under pandas 3 (Arrow-backed strings), which json.dumps would write as the token NaN, read as "NaN"
            row = {k: None if isinstance(v, float) and np.isnan(v) else v for k, v in row.items()}
            f.write(json.dumps(row) + "\n")
    os.replace(tmp, path)  # the file source sees whole files only


def ground_truth(frame: pd.DataFrame) -> pd.DataFrame:
    """The table the events describe: each key's latest event, unless it is a delete."""
    latest = frame.sort_values(["id", "seq"]).drop_duplicates("id", keep="last")
    live = latest[latest.op != "delete"]
    return live[["id", "seq", "name", "amount"]].sort_values("id").reset_index(drop=True)
