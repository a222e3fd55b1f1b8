"""Stateful processors written for Spark's ``transformWithStateInPandas``, as Spark's own PySpark tests write them.

They follow the processors of Spark's test helper
(python/pyspark/sql/tests/pandas/helper/helper_pandas_transform_with_state.py,
the pandas variants of PySpark 4.0): the same states, schemas, timers and
outputs. ``test_conformance.py`` runs each on Spark and, after the renaming in
``port`` (nothing else), on rockstate.
"""

from typing import Iterator

import pandas as pd
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import IntegerType, StringType, StructField, StructType, TimestampType

INT_VALUE = StructType([StructField("value", IntegerType(), True)])
TTL_MS = 10000  # as Spark's test; the harness waits 6 s of the batch clock between batches, as Spark's sleeps


class SimpleStatefulProcessor(StatefulProcessor):
    """A running count of violations (temperature > 100) per key, in a value state; a deleted state stays unusable."""

    expected = {0: {"0": 1, "1": 2}, 1: {"0": 4, "1": 3}}

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.violations = handle.getValueState("numViolations", "value int")  # a DDL string
        self.temp = handle.getValueState("tempState", INT_VALUE)  # a StructType
        handle.deleteIfExists("tempState")

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:
        try:
            self.temp.exists()
            raise AssertionError("a state deleted by deleteIfExists answered")
        except AssertionError:
            raise
        except Exception:  # Spark: PySparkRuntimeError; rockstate: InvalidInputError
            pass
        batch = 1 if self.violations.exists() else 0
        total = self.violations.get()[0] if batch else 0
        if batch:
            assert total == self.expected[0][key[0]]
        count = 0
        for pdf in rows:
            count += int(pdf["temperature"].count())
            total += int((pdf["temperature"] > 100).sum())
        assert total == self.expected[batch][key[0]]
        self.violations.update((total,))
        yield pd.DataFrame({"id": key, "countAsString": str(count)})


class SimpleTTLStatefulProcessor(SimpleStatefulProcessor):
    """The same with a TTL on the count (long enough not to expire)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.violations = handle.getValueState("numViolations", INT_VALUE, 30000)
        self.temp = handle.getValueState("tempState", INT_VALUE)
        handle.deleteIfExists("tempState")


class InvalidSimpleStatefulProcessor(StatefulProcessor):
    """Reading and clearing a value state that holds nothing."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.violations = handle.getValueState("numViolations", INT_VALUE)

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:
        assert not self.violations.exists() and self.violations.get() is None
        self.violations.clear()
        yield pd.DataFrame({"id": key, "countAsString": "0"})


class ListStateProcessor(StatefulProcessor):
    """List states: put, appendValue, appendList, several iterators at once, timestamps."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        temperature = StructType([StructField("temperature", IntegerType(), True)])
        self.list1 = handle.getListState("listState1", temperature)
        self.list2 = handle.getListState("listState2", temperature)
        self.times = handle.getListState("listStateTimestamp", StructType([StructField("time", TimestampType(), True)]))

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:
        count, times = 0, []
        for pdf in rows:
            for state, extra in ((self.list1, 111), (self.list2, 222)):
                state.put([(120,), (20,)])
                state.appendValue((extra,))
                state.appendList([(120,), (20,)])
            count += int(pdf["temperature"].count())
            times.append((pd.Timestamp(timerValues.getCurrentProcessingTimeInMs(), unit="ms") + pd.Timedelta(minutes=1),))
        one, two, again = self.list1.get(), self.list2.get(), self.list1.get()
        for expected in (120, 20):
            assert next(one)[0] == expected and next(two)[0] == expected and next(again)[0] == expected
        assert (next(one)[0], next(two)[0], next(again)[0]) == (111, 222, 111)
        assert [v[0] for v in one] == [120, 20] and [v[0] for v in two] == [120, 20]
        if times:
            self.times.put(times)
        yield pd.DataFrame({"id": key, "countAsString": str(count)})


class ListStateLargeTTLProcessor(ListStateProcessor):
    def init(self, handle: StatefulProcessorHandle) -> None:
        temperature = StructType([StructField("temperature", IntegerType(), True)])
        self.list1 = handle.getListState("listState1", temperature, 30000)
        self.list2 = handle.getListState("listState2", temperature, 30000)
        self.times = handle.getListState("listStateTimestamp", StructType([StructField("time", TimestampType(), True)]))


class MapStateProcessor(StatefulProcessor):
    """A map state: updateValue, containsKey, getValue, keys/values/iterator in key order, removeKey, clear."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.map = handle.getMapState("mapState", "name string", "count int")

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:
        count = sum(int(pdf["temperature"].count()) for pdf in rows)
        first, second = ("key1",), ("key2",)
        v1 = count + (self.map.getValue(first)[0] if self.map.exists() and self.map.containsKey(first) else 0)
        v2 = count + (self.map.getValue(second)[0] if self.map.exists() and self.map.containsKey(second) else 0)
        self.map.updateValue(first, (v1,))
        self.map.updateValue(second, (v2,))
        assert [k[0] for k in self.map.keys()] == ["key1", "key2"]
        assert [v[0] for v in self.map.values()] == [v1, v2]
        entries = self.map.iterator()
        assert next(entries)[0] == first and next(entries)[1] == (v2,)
        self.map.removeKey(first)
        assert not self.map.containsKey(first) and self.map.exists()
        if key == ("1",):  # keep one key's map, so the final states have something to compare
            yield pd.DataFrame({"id": key, "countAsString": str(count)})
            return
        self.map.clear()
        assert not self.map.exists()
        yield pd.DataFrame({"id": key, "countAsString": str(count)})


class MapStateLargeTTLProcessor(MapStateProcessor):
    def init(self, handle: StatefulProcessorHandle) -> None:
        self.map = handle.getMapState("mapState", "name string", "count int", 30000)


class TTLStatefulProcessor(StatefulProcessor):
    """Value, list and map state with a TTL next to a value state without one; key "0" skips its batch-1 update."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.ttl_count = handle.getValueState("ttl-state", INT_VALUE, TTL_MS)
        self.count = handle.getValueState("state", INT_VALUE)
        self.ttl_list = handle.getListState("ttl-list-state", INT_VALUE, TTL_MS)
        self.ttl_map = handle.getMapState("ttl-map-state", StructType([StructField("id", StringType(), True)]), INT_VALUE, TTL_MS)

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:
        count = self.count.get()[0] if self.count.exists() else 0
        ttl_count = self.ttl_count.get()[0] if self.ttl_count.exists() else 0
        listed = sum(v[0] for v in self.ttl_list.get()) if self.ttl_list.exists() else 0
        mapped = self.ttl_map.getValue(key)[0] if self.ttl_map.exists() else 0
        n = sum(int(pdf["temperature"].count()) for pdf in rows)
        count, ttl_count, listed, mapped = count + n, ttl_count + n, listed + n, mapped + n
        self.count.update((count,))
        if not (ttl_count == 2 and key[0] == "0"):
            self.ttl_count.update((ttl_count,))
            self.ttl_list.put([(listed,), (listed,)])
            self.ttl_map.updateValue(key, (mapped,))
        k = key[0]
        yield pd.DataFrame({"id": [f"ttl-count-{k}", f"count-{k}", f"ttl-list-state-count-{k}", f"ttl-map-state-count-{k}"],
                            "count": [ttl_count, count, listed, mapped]})


class ProcTimeStatefulProcessor(StatefulProcessor):
    """A count per key; key "0" registers a processing-time timer each batch, which clears the count when it fires."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.count = handle.getValueState("count_state", StructType([StructField("value", StringType(), True)]))

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
        listed = list(self.handle.listTimers())
        assert listed == list(self.handle.listTimers()) and len(listed) in (0, 2)
        self.count.clear()
        self.handle.deleteTimer(expiredTimerInfo.getExpiryTimeInMs())
        yield pd.DataFrame({"id": key, "countAsString": "-1", "timeValues": str(expiredTimerInfo.getExpiryTimeInMs())})

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:
        count = int(self.count.get()[0]) if self.count.exists() else 0
        if key == ("0",):
            self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 1)
        count += sum(len(pdf) for pdf in rows)
        self.count.update((str(count),))
        yield pd.DataFrame({"id": key, "countAsString": str(count), "timeValues": str(timerValues.getCurrentProcessingTimeInMs())})


class EventTimeStatefulProcessor(StatefulProcessor):
    """The largest event time per key; a timer at the current watermark clears it."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.max_state = handle.getValueState("max_state", StructType([StructField("value", StringType(), True)]))

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
        self.max_state.clear()
        self.handle.deleteTimer(expiredTimerInfo.getExpiryTimeInMs())
        yield pd.DataFrame({"id": (f"{key[0]}-expired",), "timestamp": str(expiredTimerInfo.getExpiryTimeInMs())})

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:
        seconds = [t for pdf in rows for t in (pdf["eventTime"].astype("int64") // 10**9).tolist()]
        current = int(self.max_state.get()[0]) if self.max_state.exists() else 0
        top = str(max(current, max(seconds)))
        self.max_state.update((top,))
        self.handle.registerTimer(timerValues.getCurrentWatermarkInMs())
        yield pd.DataFrame({"id": key, "timestamp": top})


class SimpleStatefulProcessorWithInitialState(StatefulProcessor):
    """A running sum per key, started from the initial state's ``initVal``."""

    initial = {("0",): 789, ("3",): 987}

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.value_state = handle.getValueState("value_state", INT_VALUE)

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:
        total = self.value_state.get()[0] if self.value_state.exists() else 0
        total += sum(int(pdf["temperature"].astype(int).sum()) for pdf in rows)
        self.value_state.update((total,))
        yield pd.DataFrame({"id": key, "value": str(total)})

    def handleInitialState(self, key, initialState, timerValues) -> None:
        value = initialState.at[0, "initVal"]
        self.value_state.update((value,))
        assert self.initial[key] == value


class StatefulProcessorWithInitialStateTimers(SimpleStatefulProcessorWithInitialState):
    """The same; the initial state also registers a timer that has already expired."""

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
        self.handle.deleteTimer(expiredTimerInfo.getExpiryTimeInMs())
        yield pd.DataFrame({"id": (f"{key[0]}-expired",), "value": str(expiredTimerInfo.getExpiryTimeInMs())})

    def handleInitialState(self, key, initialState, timerValues) -> None:
        super().handleInitialState(key, initialState, timerValues)
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() - 1)


class StatefulProcessorWithListStateInitialState(SimpleStatefulProcessorWithInitialState):
    def init(self, handle: StatefulProcessorHandle) -> None:
        super().init(handle)
        self.list_state = handle.getListState("list_state", INT_VALUE)

    def handleInitialState(self, key, initialState, timerValues) -> None:
        for value in initialState["initVal"].tolist():
            self.list_state.appendValue((value,))


class StatefulProcessorChainingOps(StatefulProcessor):
    """No state: each key's first event time of the batch, for a downstream aggregation."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        pass

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:
        for pdf in rows:
            times = pdf["eventTime"].tolist()
        yield pd.DataFrame({"id": key, "outputTimestamp": times[0]})


class SessionTimeoutProcessor(StatefulProcessor):
    """Sessions per key closed by a processing-time timer ``gap_ms`` after their last event."""

    gap_ms = 1

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.events = handle.getValueState("events", "n bigint")

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:
        for t in self.handle.listTimers():
            self.handle.deleteTimer(t)
        n = (self.events.get()[0] if self.events.exists() else 0) + sum(len(pdf) for pdf in rows)
        self.events.update((n,))
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + self.gap_ms)
        return iter([])

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
        n = self.events.get()[0]
        self.events.clear()
        yield pd.DataFrame({"id": key, "events": [n]})
