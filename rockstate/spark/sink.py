"""A streaming sink: ``df.writeStream.format("rockstate")`` writes rows into a state, exactly once per micro-batch.

::

    register_data_source(spark)
    (events.writeStream.format("rockstate")
        .option("address", "coordinator:7400")    # the cluster's coordinator
        .option("state", "orders")                # a value state (created if missing)
        .option("key", "order_id")                # key column(s): "a,b" makes a tuple key
        .option("value", "status")                # the value column (default "value"); null deletes the key
        .option("checkpointLocation", "/chk/orders")
        .start())

Each row sets its key's value, like ``state.put`` (a null value: ``delete``);
within a micro-batch, the later row of a task wins for a key. Values are
what a state takes (numbers, strings, bytes, booleans, timestamps, dates,
decimals; arrays as lists; structs and maps as dicts). Keys are one
column's value or a tuple of several columns' values, hashed as Spark hashes
them, so ``rs.value_state("orders").get(order_id)`` reads what the sink
wrote. ``secret_file``: a file holding the cluster's client secret (default
``$ROCKSTATE_SECRET``).

Exactly once, committed by batch id (Spark 4.0+, the Python data source
API). Spark's task for input partition T of micro-batch N stages its rows
on the state partitions (``store/staging.py``) under the sink's own query
name (Spark's query id, which a restart from the same checkpoint location
keeps, plus the state) and operator ``sink:T``, and marks the attempt done;
a retried or speculative attempt of T stages again and any one done attempt
is T's. When every task succeeded Spark calls ``commit(messages, N)`` on the
driver, and the sink:

1. seals N on every partition, and without synchronous backups takes a
   checkpoint (the stages must survive a node's death once N is committed);
2. fails the batch if a state partition was restored since its tasks
   started (a restore can lose stages): Spark stops the query, and its
   restart runs N again;
3. applies N: every partition's stages of N, in one RocksDB write each.
   From here the batch is visible to every reader.

If Spark runs N again after its commit (the driver died before it logged
the commit), N is already applied: its tasks' stages are refused
(``BatchAppliedError``) and the re-run writes nothing. This is Spark's own
contract for an idempotent sink (Delta's ``txnVersion``): a batch id is
committed once. Not supported: TTL states, map and list states (use
``transform_with_state`` or ``bulk_load``).

On Spark 4.1+ the writer takes Spark's Arrow batches as they are
(``DataSourceStreamArrowWriter``: keys hashed column-wise, no Row objects);
on 4.0 it takes Rows.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import datasource as sds
from pyspark.sql import types as T

from ..cluster.security import load_secret
from ..errors import BatchAppliedError, ConfigError, InvalidInputError, StageIncompleteError, StateKindError
from ..serde import encode_values
from ..runs import write_order
from ..states import ValueState, prepare_keys
from ..store.partition import DELETE_MANY, PUT_MANY
from .arrow_values import encode_column
from .bulk import pylist
from .client import StateClientSpec, as_spec, backend_for
from .microbatch import MicroBatch, StagingWriter, last_event, per_batch_checkpoint, take_checkpoint

CHUNK_ROWS = 10_000  # Rows gathered per staged piece on Spark 4.0 (Arrow batches are staged as Spark cuts them)
RESTORES = ("partition_restored", "cluster_restored")
ArrowWriter = getattr(sds, "DataSourceStreamArrowWriter", None)  # Spark 4.1+


@dataclass
class SinkCommit(sds.WriterCommitMessage):
    """What one task tells the driver's commit: where it staged, and since when it watched for restores."""

    query: str
    batch: int
    mark: int  # the cluster's last event when the task started
    applied: bool  # the batch was already applied: a re-run of a committed batch, which wrote nothing


@dataclass(frozen=True)
class SinkOptions:
    """The parsed ``.option(...)``s; checked on the driver when the query starts."""

    spec: StateClientSpec
    state: str
    keys: tuple[str, ...]
    value: str

    @classmethod
    def parse(cls, options: dict, schema: T.StructType) -> SinkOptions:
        options = {k.lower(): v for k, v in options.items()}
        address = options.get("address")
        if not address:
            raise ConfigError('the rockstate sink needs option "address": the coordinator\'s host:port')
        state = options.get("state")
        if not state:
            raise ConfigError('the rockstate sink needs option "state": the value state to write')
        keys = tuple(k.strip() for k in (options.get("key") or "key").split(","))
        value = options.get("value") or "value"
        columns = schema.fieldNames()
        for name in (*keys, value):
            if name not in columns:
                raise InvalidInputError(f"the rockstate sink's column {name!r} is not in the stream; its columns are {columns} "
                                        '(name them with .option("key", ...) and .option("value", ...))')
        if value in keys or len(set(keys)) != len(keys):
            raise InvalidInputError(f"the rockstate sink's key columns {list(keys)} and value column {value!r} must differ")
        spec = as_spec(address)
        secret = load_secret(options.get("secret_file"))
        if secret is not None:
            spec = StateClientSpec(spec.address, secret=secret)
        return cls(spec, state, keys, value)


def stream_writer(options: dict, schema: T.StructType) -> sds.DataSourceStreamWriter:
    """The writer for ``streamWriter``: Arrow batches on Spark 4.1+, Rows on 4.0. Defines the state, or checks it."""
    parsed = SinkOptions.parse(options, schema)
    backend = backend_for(parsed.spec)
    try:
        ValueState(backend, parsed.state, create=True)
    except StateKindError as e:
        raise StateKindError(f"{e}: the rockstate sink writes value states without TTL; write into another state",
                             state=parsed.state) from None
    return ArrowStateWriter(parsed) if ArrowWriter is not None else RowStateWriter(parsed, schema)


class _Writer:
    """The sink's Spark-side half: ``write`` in each task, ``commit`` on the driver (see the module's docstring)."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    # -- in a Spark task ---------------------------------------------------------------

    def _write(self, chunks: Iterator[tuple[Any, Any]]) -> SinkCommit:
        """Stage every (keys, values) chunk as this task's attempt of the micro-batch."""
        micro = MicroBatch.of_task()
        if micro is None:
            raise InvalidInputError("the rockstate sink runs in a streaming query (writeStream); for a batch DataFrame "
                                    "use rockstate.spark.bulk_load or a state's put_many")
        backend = backend_for(self.options.spec)
        query = f"{micro.query}:sink:{self.options.state}"
        writer = StagingWriter(backend, MicroBatch(query, micro.batch, micro.run), f"sink:{TaskContext.get().partitionId():06d}")
        mark = last_event(backend)
        try:
            for keys, values in chunks:
                self._stage(writer, backend, keys, values)
                writer.flush()
            writer.done()
        except BatchAppliedError:
            for _ in chunks:  # the batch was committed before: consume the input, write nothing
                pass
            return SinkCommit(query, micro.batch, mark, applied=True)
        return SinkCommit(query, micro.batch, mark, applied=False)

    def _stage(self, writer: StagingWriter, backend, keys: Any, values: Any) -> None:
        """One chunk: ``values`` a list of Python values or an Arrow column, None (null) deleting the key."""
        limit = backend.max_value_bytes
        stored = encode_column(values) if isinstance(values, pa.Array) else None
        if stored is None or max((len(v) for v in stored if v is not None), default=0) > limit:
            stored = _encoded(pylist(values) if isinstance(values, pa.Array) else values, limit)  # names a bad value
        encoded, pids = prepare_keys(keys, backend.partitions, backend.max_key_bytes)
        latest = dict(zip(zip(encoded, pids.tolist()), stored))  # a key's later row wins
        state = self.options.state
        for op, rows in ((PUT_MANY, [(k, p, v) for (k, p), v in latest.items() if v is not None]),
                         (DELETE_MANY, [(k, p, None) for (k, p), v in latest.items() if v is None])):
            if not rows:
                continue
            order, groups = write_order(np.fromiter((r[1] for r in rows), np.int64, len(rows)), [r[0] for r in rows])
            idx = order.tolist()
            for pid, a, b in groups:
                chosen = [rows[i] for i in idx[a:b]]
                writer.add(pid, (op, state, [r[0] for r in chosen], None if op == DELETE_MANY else [r[2] for r in chosen]))

    # -- on the driver ------------------------------------------------------------------

    def commit(self, messages: list, batchId: int) -> None:
        done = [m for m in messages if isinstance(m, SinkCommit)]
        if not done:
            return  # no task ran: nothing was staged
        backend, query = backend_for(self.options.spec), done[0].query
        if not any(m.applied for m in done):
            backend.seal(query, batchId, "")
            if per_batch_checkpoint(backend):
                take_checkpoint(backend)
            restores = [e for e in backend.events(min(m.mark for m in done)) if e["event"] in RESTORES]
            if restores:
                raise StageIncompleteError(
                    f"rockstate sink into {self.options.state!r}, batch {batchId}: state partitions were restored while it "
                    f"ran ({sorted({str(e.get('partition')) for e in restores})[:8]}) and may have lost its rows; restart "
                    "the query: Spark runs the batch again")
        backend.advance_batches(query, batchId + 1)  # applies N everywhere (finishes an earlier commit's, if one was cut)

    def abort(self, messages: list, batchId: int) -> None:
        """Nothing to undo: the attempts' stages are never applied, and the next batch's apply drops them."""


class RowStateWriter(_Writer, sds.DataSourceStreamWriter):
    """Spark 4.0: rows, gathered into chunks, their values as the Arrow path gives them (``_plain``)."""

    def __init__(self, options: SinkOptions, schema: T.StructType) -> None:
        super().__init__(options)
        self.types = {f.name: f.dataType for f in schema.fields}

    def write(self, iterator: Iterator) -> SinkCommit:
        return self._write(self._chunks(iterator))

    def _chunks(self, rows: Iterator) -> Iterator[tuple[Any, Any]]:
        chunk: list = []
        for row in rows:
            chunk.append(row)
            if len(chunk) == CHUNK_ROWS:
                yield self._columns(chunk)
                chunk = []
        if chunk:
            yield self._columns(chunk)

    def _columns(self, rows: list) -> tuple[list, list]:
        keys, value = self.options.keys, self.options.value
        columns = [[_plain(r[k], self.types[k]) for r in rows] for k in keys]
        return columns[0] if len(keys) == 1 else list(zip(*columns)), [_plain(r[value], self.types[value]) for r in rows]


def _encoded(values: list, limit: int) -> list[bytes | None]:
    """Stored values of the non-null ones, None for the nulls."""
    present = [v for v in values if v is not None]
    stored = iter(encode_values(present, limit))
    return [None if v is None else next(stored) for v in values]


def _plain(value: Any, dtype: T.DataType) -> Any:
    """A Row's value as Arrow gives it: structs as dicts, timestamps (naive local time in a Row) in UTC."""
    if value is None:
        return None
    if isinstance(dtype, T.TimestampType):
        return value.astimezone(datetime.timezone.utc)
    if isinstance(dtype, T.StructType):
        return {f.name: _plain(value[f.name], f.dataType) for f in dtype.fields}
    if isinstance(dtype, T.ArrayType):
        return [_plain(v, dtype.elementType) for v in value]
    if isinstance(dtype, T.MapType):
        return {_plain(k, dtype.keyType): _plain(v, dtype.valueType) for k, v in value.items()}
    return value


if ArrowWriter is not None:
    class ArrowStateWriter(_Writer, ArrowWriter):  # type: ignore[misc, valid-type]
        """Spark 4.1+: Spark's Arrow batches, keys hashed column-wise."""

        def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
            return self._write(self._chunks(iterator))

        def _chunks(self, batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[Any, Any]]:
            for batch in batches:
                if not batch.num_rows:
                    continue
                columns = [batch.column(k) for k in self.options.keys]
                keys = columns[0] if len(columns) == 1 else list(zip(*map(pylist, columns)))
                yield keys, batch.column(self.options.value)
