"""``transform_with_state``: keyed state for a DataFrame, served in batches inside ``mapInArrow``.

On the driver: the rows get their rockstate partition from Spark SQL
(``with_partition``), are shuffled so each task holds whole partitions of as
few owners as possible (``route_by_owner``; the shuffle also makes each key
live in exactly one task, so no two tasks race on a key's state), sorted by
key within each task when the DataFrame is not streaming, and handed to
``mapInArrow``.

In each task (``task.TaskRunner``): the processor is initialised once, the
task's Arrow batches are regrouped into sorted chunks of whole keys
(``chunks``), and for each chunk the processor runs over a ``Batch``:
committed state is read with one ``get_many`` per state (per owner), writes
are buffered and flushed as one backend write when the chunk is done, and
only then is the chunk's output yielded; the initial state comes before the
chunks and the expired timers after them. In a streaming query the writes are staged as the
micro-batch's version (``microbatch``), so a re-run replaces them; outside
one they are written directly, before Spark sees the rows that depend on
them.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..api import Rockstate
from ..errors import InvalidInputError, TimerModeError
from ..store.catalog import check_name
from .client import StateClientSpec, as_spec, backend_for
from .clock import MODES
from .exactly_once import current_transaction
from .initial import write_initial_state
from .listener import watch_batches
from .microbatch import MicroBatch, Sealing, warn_if_outside_a_stream
from .partitioning import PARTITION_COLUMN, heartbeat, key_names, route_by_owner, task_of_partition, with_markers, with_partition
from .processor import StatefulProcessor
from .task import Plan, TaskRunner, _mode

MAX_BATCH_BYTES = 64 << 20


_parsed: dict[str, T.StructType] = {}  # DDL text -> its schema: inside foreachBatch the operator is built every batch


def _parse(session, ddl: str) -> T.StructType:
    """A DDL string parsed by the session (Spark Connect has no local parser), once per process."""
    parsed = _parsed.get(ddl)
    if parsed is None:
        parsed = _parsed[ddl] = session.createDataFrame([], ddl).schema
    return parsed


def _struct(session, schema: T.StructType | str) -> T.StructType:
    """``schema`` as a StructType."""
    try:
        parsed = _parse(session, schema) if isinstance(schema, str) else schema
    except Exception as exc:  # Spark's parse error, as ours
        raise InvalidInputError(f"output_schema {schema!r} is not a DDL string of columns: {exc}") from None
    if not isinstance(parsed, T.StructType):
        raise InvalidInputError(f"output_schema must be a StructType or a DDL string of columns, got {schema!r}")
    return parsed


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
    time_mode: str = "none",
    output_mode: str = "append",
    event_time_column: str | None = None,
    watermark_delay: str | int | None = None,
    output_event_time_column: str | None = None,
    initial_state=None,
    fire_on_idle: bool = False,
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

    Spark's options: ``time_mode`` ("none", "processingtime", "eventtime":
    what timers and ``TimerValues`` follow); ``output_mode`` ("append",
    "update"); ``initial_state`` (a DataFrame, or ``df.groupBy(keys)`` of one,
    applied in the query's first batch, see ``initial``);
    ``output_event_time_column`` (Spark's ``eventTimeColumnName``: the output
    column that carries event time on, for a downstream stateful operator).
    In event time, ``event_time_column`` and ``watermark_delay`` ("10
    seconds", or ms) say what the operator's watermark follows; by default
    the input's ``withWatermark``. Late rows are dropped (``late_rows``
    counts them). ``fire_on_idle``: timers fire in every micro-batch the
    trigger starts, input or not (a ``rate`` source of one row a second is
    unioned in; its rows only tell each task its partitions, the processor
    never sees them).

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
    _mode(processor)
    time_mode = _choice("time_mode", time_mode, MODES)
    _choice("output_mode", output_mode, ("append", "update"))
    if fire_on_idle and (not df.isStreaming or time_mode == "none"):
        raise InvalidInputError("fire_on_idle is for timers of a streaming query: a streaming DataFrame and time_mode "
                                "'processingtime' or 'eventtime'")
    spec = as_spec(client)
    txn = current_transaction()  # set by exactly_once around its sink
    backend = client.backend if isinstance(client, Rockstate) else backend_for(spec)
    tasks = max(1, min(tasks or int(df.sparkSession.conf.get("spark.sql.shuffle.partitions")), backend.partitions))
    if txn is None:
        warn_if_outside_a_stream(df)
        watch_batches(df, spec)  # the state visible as Spark commits each batch (exactly_once tells it its name)
        micro = counters = None
        sealing = Sealing(tasks, _record_partitions(backend.table.owners))
    else:
        txn.operators.append(operator)
        txn.counters = txn.counters or _counters(df)
        micro, counters, sealing = MicroBatch(txn.query, txn.batch, ""), txn.counters, None
    event_time_column, delay_ms = _event_time(df, time_mode, event_time_column, watermark_delay)
    assignment = task_of_partition(backend.table.owners, tasks)
    schemas, ttl = _state_schemas(df.sparkSession, processor, backend.partitions)
    plan = Plan(
        keys=tuple(names), schema=_struct(df.sparkSession, output_schema), max_batch_bytes=max_batch_bytes,
        operator=operator, namespace=namespace, streaming=df.isStreaming,
        task_pids=tuple(tuple(p for p, t in enumerate(assignment) if t == i) for i in range(tasks)),
        time_mode=time_mode, event_time_column=event_time_column, watermark_delay_ms=delay_ms,
        schemas=schemas, ttl=ttl,
        initial_state=None if initial_state is None else write_initial_state(backend, initial_state, names),
        timezone=df.sparkSession.conf.get("spark.sql.session.timeZone"),
    )
    runner = TaskRunner(spec, processor, plan, micro, counters, sealing)
    partitioned = with_partition(df, names, backend.partitions)
    if fire_on_idle:
        partitioned = partitioned.unionByName(heartbeat(df.sparkSession, partitioned.schema, PARTITION_COLUMN))
    if plan.markers:
        partitioned = with_markers(partitioned, PARTITION_COLUMN, backend.partitions, tasks)
    shuffled = route_by_owner(partitioned, PARTITION_COLUMN, backend.table.owners, tasks)
    if not df.isStreaming:  # Spark may not sort a stream; chunks() groups keys within a task's batch instead
        shuffled = shuffled.sortWithinPartitions(PARTITION_COLUMN, *names)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return runner(batches)

    out = shuffled.mapInArrow(run, plan.schema)
    if output_event_time_column:
        out = _carry_watermark(df, out, output_event_time_column, delay_ms)
    return out


def _carry_watermark(df: DataFrame, out: DataFrame, column: str, delay: int) -> DataFrame:
    """The output with ``column`` as the column the query's watermark applies to, as Spark's ``eventTimeColumnName``.

    Behind the input's ``withWatermark`` (the usual case) Spark forbids a second one, and its own operator only
    moves the watermark's mark to the new column: so does this, through the column's metadata (what
    ``withWatermark`` puts there). Without one in the input, the output gets ``withWatermark(column, "0 seconds")``."""
    if column not in out.columns:
        raise InvalidInputError(f"output_event_time_column {column!r} is not a column of output_schema; its columns are {out.columns}")
    if not _watermarks(df):
        return out.withWatermark(column, "0 seconds")
    return out.withColumn(column, F.col(column).alias(column, metadata={"spark.watermarkDelayMs": delay}))


def _watermarks(df: DataFrame) -> list[tuple[str, str]]:
    """(column, delay) of every ``withWatermark`` in ``df``'s plan ([] under Spark Connect: no plan on the client)."""
    try:
        return _WATERMARK.findall(df._jdf.queryExecution().analyzed().toString())
    except Exception:
        return []


def _choice(what: str, value: str, allowed: Sequence[str]) -> str:
    chosen = str(value).lower()
    if chosen not in allowed:
        raise InvalidInputError(f"{what} must be one of {', '.join(allowed)} (any case, as in Spark), got {value!r}")
    return chosen


_UNITS = {"ms": 1, "millisecond": 1, "second": 1000, "minute": 60_000, "hour": 3_600_000, "day": 86_400_000, "week": 604_800_000}
# "EventTimeWatermark <node id>, eventTime#2: timestamp, 10 seconds" (Spark 4; Spark 3 has no node id)
_WATERMARK = re.compile(r"EventTimeWatermark\s+(?:[0-9a-f-]{36},\s*)?'?`?([\w.]+?)`?(?:#\d+)?(?::\s*\w+)?,\s*(.+)$", re.M)


def delay_ms(delay: str | int) -> int:
    """A watermark delay as milliseconds: an int (ms) or Spark's interval text ("10 seconds", "1 minute 30 seconds")."""
    if isinstance(delay, int) and not isinstance(delay, bool) and delay >= 0:
        return delay
    text = str(delay).lower().replace("interval", " ")
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]+)", text)
    if not parts or re.sub(r"(\d+(?:\.\d+)?)\s*([a-z]+)", "", text).strip():
        raise InvalidInputError(f"watermark_delay {delay!r} is not a delay: give ms, or text such as '10 seconds'")
    total = 0.0
    for number, unit in parts:
        unit = unit.rstrip("s") if unit != "ms" else unit
        if unit not in _UNITS:
            raise InvalidInputError(f"watermark_delay {delay!r}: unknown unit {unit!r} (use ms, seconds, minutes, hours, days)")
        total += float(number) * _UNITS[unit]
    return int(total)


def _event_time(df: DataFrame, time_mode: str, column: str | None, delay: str | int | None) -> tuple[str | None, int]:
    """The input's event-time column and watermark delay: as given, else from the input's ``withWatermark``."""
    if column is None and delay is None and time_mode == "eventtime":
        found = _watermarks(df)
        if found:
            column, delay = found[-1]
    if column is None:
        if time_mode == "eventtime":
            raise TimerModeError("time_mode='eventtime' needs the input's event time: event_time_column= and "
                                 "watermark_delay=, or df.withWatermark(column, delay) before the operator")
        if delay is not None:
            raise InvalidInputError("watermark_delay needs event_time_column")
        return None, 0
    if column not in df.columns:
        raise InvalidInputError(f"event_time_column {column!r} is not a column of the input; its columns are {df.columns}")
    if time_mode != "eventtime":
        raise TimerModeError("event_time_column needs time_mode='eventtime'")
    return column, delay_ms(delay or 0)


def _state_schemas(session, processor: StatefulProcessor, partitions: int) -> tuple[dict[str, T.StructType], bool]:
    """Every DDL schema the processor's ``init`` asks for, parsed here by the session (tasks have no parser); and
    whether it asks for a state with a TTL."""
    collector = _SchemaCollector(partitions)
    copy.deepcopy(processor).init(collector)
    parsed = {}
    for ddl in collector.ddl:
        try:
            parsed[ddl] = _parse(session, ddl)
        except Exception as exc:
            raise InvalidInputError(f"state schema {ddl!r} is not a DDL string of fields: {exc}") from None
    return parsed, collector.ttl


class _SchemaCollector:
    """A stand-in handle for running ``init`` on the driver (as Spark does): notes the DDL strings asked for."""

    def __init__(self, partitions: int) -> None:
        self.partitions, self.ddl, self.ttl = partitions, set(), False

    def __getattr__(self, method: str):
        def call(*args, **kwargs):
            if method.endswith("_state"):
                self.ddl.update(s for s in (*args[1:], *kwargs.values()) if isinstance(s, str))
                ttl_at = 3 if "map" in method else 2  # get_map_state(name, user_key_schema, value_schema, ttl_duration_ms)
                ttl = (args[ttl_at] if len(args) > ttl_at else None, kwargs.get("ttl"), kwargs.get("ttl_duration_ms"))
                self.ttl = self.ttl or any(t is not None for t in ttl)
        return call


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
