"""``initial_state=``: state to start a query from, applied once, in the query's first micro-batch.

Spark's ``transformWithStateInPandas(initialState=...)`` cogroups a batch
DataFrame with the stream's first batch. A streaming DataFrame cannot be
unioned with a batch one, so rockstate takes another road: when the operator
is built, the initial-state rows are written, grouped by key, into an
internal state of their own (``_initial.<id>``, on each key's partition). In
the query's first batch (batch 0) every task reads the rows of its
partitions, calls ``handle_initial_state`` for each key before any input
row, and deletes them *with the batch's writes*: so a re-run of batch 0 sees
them again, and once batch 0 is applied they are gone. A query restarted
after batch 0 never reads the rows it wrote again; its tasks remove them.
Outside a streaming query the initial state is applied on every run.

The rows go through the driver (``toPandas``): an initial state is meant to
seed a query, not to bulk-load it (``bulk_load`` does that).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import pandas as pd

from ..errors import InvalidInputError
from ..ops import DELETE_MANY, PUT_MANY
from ..serde import decode_key, decode_value, encode_values
from ..states import prepare_keys
from ..store.catalog import StateSpec
from .client import define_state
from .values import plain

PAGE = 1000


def write_initial_state(backend, initial, keys: Sequence[str]) -> tuple[str, tuple[str, ...]]:
    """Write ``initial`` (a DataFrame, or Spark's ``GroupedData`` of one) grouped by ``keys``; returns (state, columns)."""
    df = getattr(initial, "_df", initial)  # GroupedData: its DataFrame (grouped by the same key columns)
    if not hasattr(df, "toPandas") or df.isStreaming:
        raise InvalidInputError("initial_state must be a batch DataFrame (or df.groupBy(keys)), as Spark's initialState")
    missing = [k for k in keys if k not in df.columns]
    if missing:
        raise InvalidInputError(f"initial_state lacks the key columns {missing}; its columns are {df.columns}")
    rows = df.toPandas()
    columns = tuple(rows.columns)
    state = f"_initial.{secrets.token_hex(8)}"
    define_state(backend, StateSpec(state, "value"))
    if rows.empty:
        return state, columns
    groups = rows.groupby(list(keys), sort=False, dropna=False)
    group_keys = [plain(k if len(keys) > 1 else (k[0] if isinstance(k, tuple) else k)) for k in groups.groups]
    records = [[[plain(v) for v in row] for row in group.itertuples(index=False, name=None)] for _, group in groups]
    encoded, pids = prepare_keys(group_keys, backend.partitions, backend.max_key_bytes)
    values = encode_values(records, backend.max_value_bytes)
    ops: dict[int, list] = {}
    for key, pid, value in zip(encoded, pids.tolist(), values):
        ops.setdefault(pid, []).append((key, value))
    backend.write({pid: [(PUT_MANY, state, [k for k, _ in kv], [v for _, v in kv])] for pid, kv in ops.items()})
    return state, columns


def read_initial_state(backend, state: str, pids: Sequence[int], columns: Sequence[str]):
    """(encoded key, partition, key tuple, rows DataFrame) of every key of the initial state on ``pids``."""
    for pid in pids:
        after = None
        while True:
            page = backend.scan(state, pid, b"", after, PAGE)
            for key, value in page:
                decoded = decode_key(key)
                yield key, pid, decoded if isinstance(decoded, tuple) else (decoded,), pd.DataFrame(decode_value(value), columns=list(columns))
            if len(page) < PAGE:
                break
            after = page[-1][0]


def delete_initial_state(writer, state: str, keys_by_pid: dict[int, list[bytes]]) -> None:
    for pid, keys in keys_by_pid.items():
        if keys:
            writer.add(pid, (DELETE_MANY, state, keys, None))
