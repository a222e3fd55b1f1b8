"""``transform_with_state``: keyed state for a DataFrame, served in batches inside ``mapInArrow``.

On the driver: the rows get their rockstate partition from Spark SQL
(``with_partition``), are shuffled so each task holds whole partitions of as
few owners as possible (``route_by_owner``; the shuffle also makes each key
live in exactly one task, so no two tasks race on a key's state), sorted by
key within each task when the DataFrame is not streaming, and handed to
``mapInArrow``.

In each task (``TaskRunner``): the processor is initialised once, the task's
Arrow batches are regrouped into sorted chunks of whole keys (``chunks``), and
for each chunk the processor runs over a ``Batch``: committed state is read
with one ``get_many`` per state (per owner), writes are buffered and flushed
as one backend write when the chunk is done, and only then is the chunk's
output yielded. In a streaming query the writes are staged as the
micro-batch's version (``microbatch``), so a re-run replaces them; outside
one they are written directly, before Spark sees the rows that depend on
them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from ..api import Rockstate
from ..errors import InvalidInputError, UnsupportedShapeError
from ..store.catalog import check_name
from ..serde import encode_keys
from .batch import Batch, BatchWriter
from .chunks import chunks
from .client import StateClientSpec, as_spec, backend_for
from .exactly_once import current_transaction
from .microbatch import BatchTask, MicroBatch, Sealing, warn_if_outside_a_stream
from .partitioning import PARTITION_COLUMN, key_names, route_by_owner, with_partition
from .processor import StatefulProcessor, StatefulProcessorHandle

MAX_BATCH_BYTES = 64 << 20


def _mode(processor: object) -> str:
    if not isinstance(processor, StatefulProcessor):
        raise InvalidInputError(f"processor must be a rockstate.spark.StatefulProcessor, got {type(processor).__name__}")
    modes = [m for m in ("handle_batch", "handle_input_rows") if callable(getattr(processor, m, None))]
    if len(modes) != 1:
        raise InvalidInputError(
            f"{type(processor).__name__} must implement exactly one of handle_batch and handle_input_rows, has {modes or 'neither'}"
        )
    return modes[0]


def _struct(session, schema: T.StructType | str) -> T.StructType:
    """``schema`` as a StructType; a DDL string is parsed by the session (Spark Connect has no local parser)."""
    try:
        parsed = session.createDataFrame([], schema).schema if isinstance(schema, str) else schema
    except Exception as exc:  # Spark's parse error, as ours
        raise InvalidInputError(f"output_schema {schema!r} is not a DDL string of columns: {exc}") from None
    if not isinstance(parsed, T.StructType):
        raise InvalidInputError(f"output_schema must be a StructType or a DDL string of columns, got {schema!r}")
    return parsed


class Output:
    """What the handlers returned for one batch: DataFrames, and rows given as tuples.

    A tuple is one output row in ``output_schema`` order: far cheaper to make
    than the one-row DataFrame a per-key handler would otherwise yield.
    """

    def __init__(self, schema: T.StructType) -> None:
        self.schema, self.arrow_schema = schema, to_arrow_schema(schema)
        self.frames: list[pd.DataFrame] = []
        self.rows: list[tuple] = []

    def add(self, result: Any) -> None:
        """A handler's result: a DataFrame, None, or an iterable of DataFrames and tuples."""
        if result is None:
            return
        if isinstance(result, pd.DataFrame):
            self.frames.append(result)
            return
        for item in result:
            if isinstance(item, tuple):
                self.rows.append(item)
            elif isinstance(item, pd.DataFrame):
                self.frames.append(item)
            elif item is not None:
                raise InvalidInputError(f"a handler yielded a {type(item).__name__}; yield pandas DataFrames or tuples (rows)")

    def batches(self) -> Iterator[pa.RecordBatch]:
        names, schema = self.arrow_schema.names, self.arrow_schema
        if self.rows:
            if any(len(row) != len(names) for row in self.rows):
                raise InvalidInputError(f"a yielded row does not have the {len(names)} fields of output_schema {self.schema.simpleString()}")
            columns = zip(*self.rows)
            yield pa.RecordBatch.from_arrays([pa.array(c, type=f.type) for c, f in zip(columns, schema)], schema=schema)
        frames = [f for f in self.frames if not f.empty]
        if frames:
            out = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
            missing = [name for name in names if name not in out.columns]
            if missing:
                raise InvalidInputError(f"the processor's output lacks columns {missing} of output_schema {self.schema.simpleString()}")
            yield pa.RecordBatch.from_pandas(out[names], schema=schema, preserve_index=False)


class TaskRunner:
    """The function ``mapInArrow`` runs in every task; pickled to the executors with the processor."""

    def __init__(self, spec: StateClientSpec, processor: StatefulProcessor, keys: Sequence[str], schema: T.StructType,
                 max_batch_bytes: int, operator: str, namespace: str | None, streaming: bool,
                 micro: MicroBatch | None, counters: list | None, sealing: Sealing | None) -> None:
        """``namespace``: the states' scope (None: the query and ``operator``); ``streaming``: the DataFrame is a
        stream (its tasks must be a micro-batch's); ``micro``: inside exactly_once, its batch (None: the task's
        own, if any); ``counters``: Spark accumulators of rows in and out; ``sealing``: how the tasks seal a
        batch (None: exactly_once does it on the driver)."""
        self.spec, self.processor, self.keys = spec, processor, list(keys)
        self.operator, self.namespace, self.streaming = operator, namespace, streaming
        self.micro, self.counters, self.sealing = micro, counters, sealing
        self.mode = _mode(processor)
        self.schema = schema
        self.max_batch_bytes = max_batch_bytes

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        backend = backend_for(self.spec)
        micro = self.micro or MicroBatch.of_task()
        if micro is None and self.streaming:
            raise UnsupportedShapeError(
                "transform_with_state ran in a streaming task without a micro-batch id (a continuous trigger?): "
                "its state could not be versioned by batch; use a micro-batch trigger (processingTime, availableNow)"
            )
        task = None if micro is None else BatchTask(backend, micro, self.operator, self.sealing)
        namespace = self.namespace
        if namespace is None:
            namespace = "" if micro is None else f"{micro.query}.{self.operator}"
        handle = StatefulProcessorHandle(backend, namespace)
        self.processor.init(handle)
        # in a micro-batch the task's writes are staged, so its later chunks read them from memory (keep)
        staged = None if task is None else Batch(backend, task.writer, keep=True)
        rows_in = rows_out = 0
        try:
            for table, starts in chunks(batches, PARTITION_COLUMN, self.keys, self.max_batch_bytes):
                batch, output = staged or Batch(backend, BatchWriter(backend)), Output(self.schema)
                rows_in += table.num_rows
                handle.begin(batch)
                if self.mode == "handle_batch":
                    output.add(self.processor.handle_batch(table.drop_columns([PARTITION_COLUMN]).to_pandas()))
                else:
                    self._per_key(handle, batch, table, starts, output)
                handle.finish()  # state first: the output below depends on it
                for out in output.batches():
                    rows_out += out.num_rows
                    yield out
            if task is not None:
                task.finish()
            if self.counters:
                self.counters[0].add(rows_in)
                self.counters[1].add(rows_out)
        finally:
            self.processor.close()

    def _per_key(self, handle: StatefulProcessorHandle, batch: Batch, table: pa.Table, starts: np.ndarray, output: Output) -> None:
        """Prefetch every key's state with one get_many per state, then call the processor key by key."""
        firsts = table.take(starts)
        key_tuples = list(zip(*(firsts.column(k).to_pylist() for k in self.keys)))
        state_keys = [k[0] for k in key_tuples] if len(self.keys) == 1 else key_tuples
        encoded = encode_keys(state_keys, handle.backend.max_key_bytes)
        pids = firsts.column(PARTITION_COLUMN).to_numpy().astype(np.int64)
        handle.prefetch(encoded, pids)
        rows = table.drop_columns([PARTITION_COLUMN]).to_pandas()
        ends = [*starts[1:].tolist(), table.num_rows]
        handler = self.processor.handle_input_rows
        for key, data, pid, start, end in zip(key_tuples, encoded, pids.tolist(), starts.tolist(), ends):
            group = rows.iloc[start:end]
            group.index = pd.RangeIndex(end - start)  # each key's rows numbered from 0, as in Spark
            batch.current = (data, pid)
            output.add(handler(key, iter([group])))
        batch.current = None


def transform_with_state(
    df: DataFrame,
    keys: str | Sequence[str],
    processor: StatefulProcessor,
    output_schema: T.StructType | str,
    client: str | StateClientSpec | Rockstate,
    *,
    name: str | None = None,
    namespace: str | None = None,
    tasks: int | None = None,
    max_batch_bytes: int = MAX_BATCH_BYTES,
) -> DataFrame:
    """Run ``processor`` over ``df``'s rows grouped by ``keys``, with its state in a rockstate cluster.

    ``keys``: the key column(s); the state key is the scalar of one column,
    the tuple of several. ``output_schema``: what the processor returns (a
    StructType or DDL string). ``client``: how executors reach the cluster, a
    coordinator address "host:port", a ``StateClientSpec`` or a
    ``rockstate.connect()`` handle (each Python worker keeps one connection
    per address; an embedded ``rockstate.open`` store is refused with
    ``UnsupportedClientError``). ``name``: the operator's name in its query
    (default: the processor's class name; give one when a query runs a
    processor class twice). ``namespace``: where its states live — by
    default, in a streaming query, ``<query id>.<name>`` (``state_name``
    spells a state's full name), so two queries can use the same state
    names; outside one, the names as given. Give the same ``namespace`` to
    share states on purpose ("" for the names as given). ``tasks``: Spark
    tasks that run the processor (default ``spark.sql.shuffle.partitions``,
    at most the cluster's partition count). ``max_batch_bytes``: how much of
    a task's input is gathered into one processor batch.

    Exactly once in a streaming query, wherever the operator is built and
    whatever the sink (see ``microbatch``): on the streaming DataFrame, then
    any sink or ``foreachBatch``; or inside ``foreachBatch``. A batch
    DataFrame outside a streaming query writes directly: a task Spark retries
    writes again (at least once), and a ``WeakerGuaranteeWarning`` says so.
    """
    names = key_names(keys)
    operator = check_name(name or type(processor).__name__, "operator")
    if namespace:
        check_name(namespace, "namespace")
    spec = as_spec(client)
    txn = current_transaction()  # set by exactly_once around its sink
    backend = client.backend if isinstance(client, Rockstate) else backend_for(spec)
    tasks = max(1, min(tasks or int(df.sparkSession.conf.get("spark.sql.shuffle.partitions")), backend.partitions))
    if txn is None:
        warn_if_outside_a_stream(df)
        micro = counters = None
        sealing = Sealing(tasks, _record_partitions(backend.table.owners))
    else:
        txn.operators.append(operator)
        txn.counters = txn.counters or _counters(df)
        micro, counters, sealing = MicroBatch(txn.query, txn.batch, ""), txn.counters, None
    runner = TaskRunner(spec, processor, names, _struct(df.sparkSession, output_schema), max_batch_bytes, operator, namespace,
                        df.isStreaming, micro, counters, sealing)
    shuffled = route_by_owner(with_partition(df, names, backend.partitions), PARTITION_COLUMN, backend.table.owners, tasks)
    if not df.isStreaming:  # Spark may not sort a stream; chunks() groups keys within a task's batch instead
        shuffled = shuffled.sortWithinPartitions(PARTITION_COLUMN, *names)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return runner(batches)

    return shuffled.mapInArrow(run, runner.schema)


def state_name(query: object, operator: str, state: str) -> str:
    """The full name of a state of operator ``operator`` in a streaming query (a ``StreamingQuery`` or its id)."""
    return f"{getattr(query, 'id', query)}.{operator}.{state}"


def _record_partitions(owners: Sequence[str | None]) -> tuple[int, ...]:
    """Partition 0 and the first partition of another node: where the tasks of a batch count themselves."""
    other = next((pid for pid, owner in enumerate(owners) if owner != owners[0]), None)
    return (0,) if other is None else (0, other)


def _counters(df: DataFrame) -> list | None:
    """Accumulators of rows in and out for exactly_once's bookkeeping; None under Spark Connect (no SparkContext)."""
    try:
        context = df.sparkSession.sparkContext
    except Exception:  # Spark Connect
        return None
    return [context.accumulator(0) for _ in range(2)]
