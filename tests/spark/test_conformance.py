"""Spark's own transformWithStateInPandas processors, on Spark and on rockstate, over the same streaming input.

Each processor of ``tws_processors`` (written for Spark, as Spark's PySpark
tests write them) runs on Spark's ``transformWithStateInPandas`` (RocksDB
state store) and, ported by the renaming in ``RENAMES`` alone, on rockstate's
``transform_with_state``: both operators in ONE streaming query over the same
files (one file per micro-batch), so they see the same batches. The outputs
must be equal batch by batch, and the final states equal, Spark's read with
its state data source.

Where rockstate differs on purpose the case says so (``mask``: output columns
holding processing times, which each engine takes from its own clock).
"""

from __future__ import annotations

import inspect
import json
import os
import re
import sys
import threading
import time
import types
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

import pytest
from pyspark import cloudpickle
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from rockstate.serde import decode_key, decode_stream, decode_value, split_pair
from rockstate.spark import settle, state_name, transform_with_state

from . import tws_processors

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors cannot import the tests
cloudpickle.register_pickle_by_value(tws_processors)

# The whole port: Spark's names on the left, rockstate's on the right (docs/spark.md has the full table).
RENAMES = {
    "from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle":
        "from rockstate.spark import StatefulProcessor, StatefulProcessorHandle",
    "handleInputRows": "handle_input_rows", "handleExpiredTimer": "handle_expired_timer",
    "handleInitialState": "handle_initial_state", "getValueState": "get_value_state", "getListState": "get_list_state",
    "getMapState": "get_map_state", "deleteIfExists": "delete_if_exists", "registerTimer": "register_timer",
    "deleteTimer": "delete_timer", "listTimers": "list_timers",
    "getCurrentProcessingTimeInMs": "get_current_processing_time_in_ms",
    "getCurrentWatermarkInMs": "get_current_watermark_in_ms", "getExpiryTimeInMs": "get_expiry_time_in_ms",
    "appendValue": "append_value", "appendList": "append_list", "getValue": "get_value", "containsKey": "contains_key",
    "updateValue": "update_value", "removeKey": "remove_key",
}


def port(module: types.ModuleType) -> types.ModuleType:
    """``module``'s processors for rockstate: its source with Spark's names renamed, nothing else."""
    source = inspect.getsource(module)
    for spark_name, ours in RENAMES.items():
        source = source.replace(spark_name, ours) if " " in spark_name else re.sub(rf"\b{spark_name}\b", ours, source)
    ported = types.ModuleType("tws_ported")  # not in sys.modules: cloudpickle sends its classes by value
    exec(compile(source, "tws_ported", "exec"), ported.__dict__)
    return ported


PORTED = port(tws_processors)


@dataclass(frozen=True)
class Case:
    processor: str
    schema: str
    time_mode: str = "None"
    initial: bool = False
    mask: Callable[[dict], dict] | None = None  # hides the output values that hold a processing time

    @property
    def name(self) -> str:
        return self.processor


@dataclass
class Group:
    """Cases run in one query over the same files."""

    files: list[list[str]]
    cases: list[Case]
    event_time: bool = False
    pause: float = 0.0  # seconds the sink waits after each batch (TTL cases)
    checks: dict = field(default_factory=dict)


R1 = ["0, 123", "0, 46", "1, 146", "1, 346"]
R2 = ["0, 123", "0, 223", "0, 323", "1, 246", "1, 6"]
R3 = ["0, 123", "1, 6"]
COUNT = "id string, countAsString string"

GROUPS = {
    "states": Group([R1, R2], [
        Case("SimpleStatefulProcessor", COUNT), Case("InvalidSimpleStatefulProcessor", COUNT),
        Case("ListStateProcessor", COUNT), Case("ListStateLargeTTLProcessor", COUNT, "processingTime"),
        Case("MapStateProcessor", COUNT), Case("MapStateLargeTTLProcessor", COUNT, "processingTime"),
        Case("SimpleTTLStatefulProcessor", COUNT, "processingTime"),
    ]),
    "timers": Group([R3, R1, R2, R3], [
        Case("ProcTimeStatefulProcessor", "id string, countAsString string, timeValues string", "processingtime", mask=lambda r: {**r, "timeValues": "<time>"}),
        Case("SessionTimeoutProcessor", "id string, events bigint", "processingtime"),
    ]),
    "initial": Group([R1, ["0, 67", "3, 12"]], [
        Case("SimpleStatefulProcessorWithInitialState", "id string, value string", initial=True),
        Case("StatefulProcessorWithInitialStateTimers", "id string, value string", "processingtime", initial=True,
             mask=lambda r: {**r, "value": "<time>"} if r["id"].endswith("-expired") else r),
        Case("StatefulProcessorWithListStateInitialState", "id string, value string", initial=True),
    ]),
    "event_time": Group([["a, 20"], ["a, 4"], ["a, 11", "a, 13", "a, 15"]], [
        Case("EventTimeStatefulProcessor", "id string, timestamp string", "eventtime"),
    ], event_time=True),
    "ttl": Group([["1, 0", "0, 0"]] * 3, [Case("TTLStatefulProcessor", "id string, count int", "processingTime")],
                 pause=3.5),
}


@pytest.fixture(scope="module")
def tws(spark):
    """Spark's session as Spark's own tests configure it for transformWithStateInPandas."""
    settings = {"spark.sql.streaming.stateStore.providerClass":
                "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
                "spark.sql.session.timeZone": "UTC", "spark.sql.shuffle.partitions": "2"}
    before = {k: spark.conf.get(k, None) for k in settings}
    for k, v in settings.items():
        spark.conf.set(k, v)
    yield spark
    for k, v in before.items():
        spark.conf.unset(k) if v is None else spark.conf.set(k, v)


def source(spark, path: str, event_time: bool) -> DataFrame:
    lines = spark.readStream.format("text").option("maxFilesPerTrigger", 1).load(path)
    parts = F.split(lines["value"], ",")
    df = lines.select(parts.getItem(0).cast("string").alias("id"), parts.getItem(1).cast("int").alias("temperature"))
    if event_time:
        df = df.select("id", F.from_unixtime("temperature").cast("timestamp").alias("eventTime")).withWatermark("eventTime", "10 seconds")
    return df


def write_files(directory, files: list[list[str]]) -> None:
    directory.mkdir()
    start = time.time() - 1000
    for i, lines in enumerate(files):
        path = directory / f"batch-{i}.txt"
        path.write_text("".join(f"{line}\n" for line in lines))
        os.utime(path, (start + i, start + i))  # the file source takes files oldest first


def run_case(spark, cluster, tmp_path, group: Group, case: Case):
    """Both engines' operators for ``case`` in one query; returns (query, outputs by (engine, batch), checkpoint)."""
    write_files(tmp_path / "in", group.files)
    df = source(spark, str(tmp_path / "in"), group.event_time)
    initial = spark.createDataFrame([("0", 789), ("3", 987)], "id string, initVal int")
    theirs = df.groupBy("id").transformWithStateInPandas(
        statefulProcessor=getattr(tws_processors, case.processor)(), outputStructType=case.schema, outputMode="Update",
        timeMode=case.time_mode, initialState=initial.groupBy("id") if case.initial else None)
    ours = transform_with_state(df, "id", getattr(PORTED, case.processor)(), case.schema, cluster.address, name=case.name,
                                time_mode=case.time_mode, output_mode="Update", initial_state=initial if case.initial else None)
    both = [out.select(F.lit(engine).alias("engine"), F.to_json(F.struct(*out.columns)).alias("row"))
            for engine, out in (("spark", theirs), ("rockstate", ours))]
    seen: dict = defaultdict(list)
    done = threading.Event()

    def collect(batch_df, batch_id):
        if batch_id < len(group.files):  # after the input Spark runs no-data batches for its timers (docs/spark.md)
            for row in batch_df.collect():
                seen[row.engine, batch_id].append(json.loads(row.row))
            time.sleep(group.pause)
        if batch_id >= len(group.files) - 1:
            done.set()

    chk = str(tmp_path / "chk")
    query = (both[0].unionByName(both[1]).writeStream.foreachBatch(collect).option("checkpointLocation", chk)
             .trigger(availableNow=True).start())
    assert done.wait(600), "the input's batches did not run"
    query.stop()
    assert query.exception() is None, query.exception()
    settle(query, cluster.address)
    return query, seen, chk


def masked(rows: list[dict], mask: Callable[[dict], dict] | None) -> list[str]:
    return sorted(json.dumps(mask(r) if mask else r, sort_keys=True) for r in rows)


def spark_states(spark, chk: str, operator: int, batch: int) -> dict[str, list]:
    """Every state variable of Spark's operator ``operator``, as (key, [user key,] value) tuples, by its state data source."""
    meta = spark.read.format("state-metadata").load(chk).filter(F.col("operatorId") == operator).collect()
    props = json.loads(meta[0]["operatorProperties"])
    out = {}
    for var in props["stateVariables"]:
        name = var["stateName"]
        df = (spark.read.format("statestore").option("operatorId", operator).option("stateVarName", name)
              .option("batchId", batch).load(chk))
        cols = [c for c in df.columns if c not in ("partition_id",)]
        out[name] = sorted((tuple(_plain(r[c]) for c in cols) for r in df.collect()), key=repr)
    return out


def _plain(value):
    if isinstance(value, T.Row):
        return tuple(_plain(v) for v in value)
    return value


def rockstate_states(rs, query, case: Case, spark_side: dict[str, list], spark_schemas: dict) -> dict[str, list]:
    """The same variables of rockstate's operator, decoded with the schemas Spark's reader gives."""
    backend, out = rs.backend, {}
    for name, rows in spark_side.items():
        full = state_name(query, case.name, name)
        schema = spark_schemas[name]
        kind, entries = "value", []
        try:
            stored = [e for pid in range(backend.partitions) for e in backend.scan(full, pid, b"", None, 100_000)]
        except Exception:  # a state rockstate never wrote: no column family
            stored = []
        for key, data in stored:
            if schema.get("map"):
                k, uk = split_pair(key)
                value = decode_value(data)
                entries.append(((k,), _internal(uk if isinstance(uk, tuple) else (uk,), schema["user"]), _value(value, schema)))
            elif schema.get("list"):
                kind = "list"
                entries.extend(((decode_key(key),), _value(v, schema)) for v in decode_stream(data))
            else:
                entries.append(((decode_key(key),), _value(decode_value(data), schema)))
        out[name] = sorted(entries, key=repr)
    return out


def _value(stored, schema):
    if schema["ttl"]:
        stored = stored[1]
    return _internal(stored, schema["value"])


def _internal(values, struct: T.StructType):
    return tuple(_plain(struct.fromInternal(list(values))))


def spark_schemas(spark, chk, operator) -> dict:
    meta = spark.read.format("state-metadata").load(chk).filter(F.col("operatorId") == operator).collect()
    props = json.loads(meta[0]["operatorProperties"])
    found = {}
    for var in props["stateVariables"]:
        df = spark.read.format("statestore").option("operatorId", operator).option("stateVarName", var["stateName"]).load(chk)
        kind = var["stateVariableType"]
        value_col = {"ValueState": "value", "ListState": "list_element", "MapState": "user_map_value"}[kind]
        found[var["stateName"]] = {"list": kind == "ListState", "map": kind == "MapState", "ttl": var.get("ttlEnabled", False),
                                   "value": df.schema[value_col].dataType,
                                   "user": df.schema["user_map_key"].dataType if kind == "MapState" else None}
    return found


CASES = [(group, case) for group in GROUPS.values() for case in group.cases]


@pytest.mark.parametrize("group, case", CASES, ids=[case.name for _, case in CASES])
def test_spark_processors_ported_by_renaming_give_sparks_output_and_state(tws, cluster, rs, tmp_path, group, case):
    query, seen, chk = run_case(tws, cluster, tmp_path, group, case)
    batches = sorted({b for _, b in seen})
    for batch in batches:
        theirs, ours = seen.get(("spark", batch), []), seen.get(("rockstate", batch), [])
        assert masked(ours, case.mask) == masked(theirs, case.mask), f"batch {batch}"
    assert any(seen.get(("spark", b)) for b in batches), "Spark gave no output at all"
    theirs = spark_states(tws, chk, 0, len(group.files) - 1)
    assert rockstate_states(rs, query, case, theirs, spark_schemas(tws, chk, 0)) == theirs
