"""The status page's pure parts: a node's load counters checked and turned into rates (web/load.py),
/api/events' query string checked (web/server.py), how often the sizes are counted (web/status.py's ``Asked``)
-- the HTTP and browser side is test_status_page.py's."""

import asyncio
import math
from types import SimpleNamespace

import pytest
from multidict import MultiDict, MultiDictProxy

from rockstate.cluster.coordinator.web.load import SAMPLE_EVERY, SAMPLES, WINDOW, LoadHistory, parse
from rockstate.cluster.coordinator.web.server import event_query
from rockstate.cluster.coordinator.web.status import FIGURES_EVERY, SIZES_EVERY, SIZES_SLOWER, Asked, events_document
from rockstate.errors import InvalidInputError

BOUNDS = [0.001, 0.01, 0.1]


def load(requests=0, seconds=0.0, buckets=None, keys_read=0, keys_written=0, bounds=BOUNDS):
    return {"requests": requests, "seconds": seconds, "bounds": list(bounds),
            "buckets": buckets if buckets is not None else [requests, 0, 0, 0], "keys_read": keys_read, "keys_written": keys_written}


@pytest.mark.parametrize("bad", [
    None, [], "x", {}, {**load(), "requests": -1}, {**load(), "requests": True}, {**load(), "seconds": math.inf},
    {**load(), "seconds": math.nan}, {**load(), "seconds": "1"}, {**load(), "keys_read": 1.5}, load(requests=3, buckets=[0, 0, 0, 0]),  # buckets sum to 0
    load(bounds=[0.1, 0.01, 1.0]), load(bounds=[0.0, 0.01, 0.1]), {**load(), "buckets": [0, 0]}, {**load(), "bounds": None},
    load(requests=2, buckets=[1, 1, 0, 0, 0]), load(bounds=[1.0] * 70, buckets=[0] * 71)])
def test_a_malformed_load_is_dropped_never_shown(bad):
    assert parse(1.0, bad) is None
    history = LoadHistory()
    history.record(1.0, {"node-1": {"load": bad}, "node-2": None, "node-3": {"rss_bytes": 1}})
    assert history.rings == {} and history.document(2.0, ["node-1"])["nodes"] == {}


def test_rates_between_samples_and_a_restart_starts_anew():
    history = LoadHistory()
    t = 100.0
    history.record(t, {"n1": {"load": load(10, 0.01, [10, 0, 0, 0], keys_written=10)}})
    history.record(t + 1, {"n1": {"load": load(99, 9.0, [99, 0, 0, 0])}})  # too soon after the first: not kept
    history.record(t + SAMPLE_EVERY, {"n1": {"load": load(110, 0.51, [90, 15, 5, 0], keys_read=50, keys_written=510)}})
    history.record(t + 2 * SAMPLE_EVERY, {"n1": {"load": load(5, 0.001, [5, 0, 0, 0])}})  # it restarted: counters went down
    history.record(t + 3 * SAMPLE_EVERY, {"n1": {"load": load(5, 0.001, [5, 0, 0, 0])}})
    points = history.document(t + 3 * SAMPLE_EVERY, ["n1"])["nodes"]["n1"]
    assert len(points) == 2, points  # the restart's interval left out
    first = points[0]
    assert first["requests_per_s"] == 100 / SAMPLE_EVERY and first["keys_written_per_s"] == 500 / SAMPLE_EVERY
    assert first["keys_read_per_s"] == 50 / SAMPLE_EVERY and first["mean_latency_s"] == pytest.approx(0.005)
    assert first["p99_latency_s"] == 0.1 and first["at"] == -2 * SAMPLE_EVERY  # 95 of 100 within 10 ms, 99th in the 0.1 bucket
    assert points[1]["requests_per_s"] == 0 and points[1]["mean_latency_s"] is None and points[1]["p99_latency_s"] is None


def test_history_is_bounded_in_time_count_and_nodes():
    history = LoadHistory()
    for i in range(3 * SAMPLES):
        history.record(i * SAMPLE_EVERY, {"n1": {"load": load(i, 0.0, [i, 0, 0, 0])}, "gone": {"load": load()}})
    assert len(history.rings["n1"]) == SAMPLES
    now = (3 * SAMPLES - 1) * SAMPLE_EVERY
    document = history.document(now, ["n1"])
    assert set(document["nodes"]) == {"n1"} and set(history.rings) == {"n1"}  # a node no longer a member forgotten
    assert all(-WINDOW <= p["at"] <= 0 for p in document["nodes"]["n1"])


def query(*pairs):
    return MultiDictProxy(MultiDict(pairs))


def test_event_query_is_checked():
    assert event_query(query()) == (None, 100)
    assert event_query(query(("type", "member_dead,member_left"), ("type", "replica_copied"), ("limit", "5"))) == (
        {"member_dead", "member_left", "replica_copied"}, 5)
    for bad in [("type", ""), ("type", "Member"), ("type", "a b"), ("type", "x" * 65), ("type", "<script>"),
                ("type", ",".join(f"t{i}" for i in range(51))), ("limit", "0"), ("limit", "1001"), ("limit", "-1"),
                ("limit", "1.5"), ("limit", "٣"), ("limit", ""), ("since", "1")]:
        with pytest.raises(InvalidInputError):
            event_query(query(bad))


def test_events_document_filters_and_counts():
    events = [{"seq": i, "time": i, "event": e} for i, e in enumerate(["a", "b", "a", "c", "a"])]
    assert events_document(events, {"a", "c"}, 2) == {"types": {"a": 3, "b": 1, "c": 1}, "events": [events[3], events[4]]}
    assert events_document(events, None, 10)["events"] == events
    assert events_document(events, {"zzz"}, 10)["events"] == []


def test_sizes_are_asked_as_often_as_the_page_refreshes_unless_counting_took_long():
    """``Asked``'s pacing alone (a stand-in channel whose answer takes as long as asked: a store slow enough to count
    would take minutes to build): every SIZES_EVERY seconds after a quick count, SIZES_SLOWER times a slow one's
    duration after it, whoever reads meanwhile."""
    took = [0.0]
    asked: list[float] = []

    class Channel:
        async def call(self, msg, timeout):
            asked.append(1)
            await asyncio.sleep(took[0])
            return {"states": {}, "partitions": {}}

    async def main():
        sizes = Asked(lambda: [SimpleNamespace(node_id="node-1")], lambda node: Channel(), lambda: None,
                      every=SIZES_EVERY, timeout=5.0, slower=SIZES_SLOWER)
        assert SIZES_EVERY == FIGURES_EVERY  # fresh with the page
        await sizes.get()
        await sizes.get()
        assert len(asked) == 1  # read again at once: the answers kept
        sizes.at -= SIZES_EVERY  # the page's next refresh
        took[0] = 0.2
        await sizes.get()  # a count that took 0.2 s
        assert len(asked) == 2 and sizes.took >= 0.2
        sizes.at -= SIZES_EVERY
        await sizes.get()
        assert len(asked) == 2  # not before SIZES_SLOWER * 0.2 s
        sizes.at -= SIZES_SLOWER * sizes.took
        await sizes.get()
        assert len(asked) == 3

    asyncio.run(main())
