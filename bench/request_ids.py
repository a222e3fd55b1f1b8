"""What applying each write once costs: the same writes with a request id and without one.

A coordinator and one node (16 partitions) run as separate OS processes on
127.0.0.1; one blocking ``Channel`` sends ``Write`` messages straight to the
node, so the only difference between the two sides is the 16-byte id, which
the node looks up and stores in the partition with the ops
(``store/requests.py``). The sides take turns in chunks, so drift on a shared
machine hits both alike.

- put, one key: ``Write`` of one PUT; p50 and p99 in µs
- put, batch 1000: ``Write`` of 1000 keys (PUT_MANY per partition); keys/s,
  the median of REPEAT runs

Values are 100 bytes, keys fresh (every id and key is new, as in a real
stream), of each kind in turn: ints, 36-character UUID strings, (tenant id,
int) tuples. After the run every key is read back through the client and
checked. BENCH_IDS_CALLS (default 3000) and BENCH_IDS_BATCHES (default 50)
shrink the run.
"""

from __future__ import annotations

import itertools
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

from common import KEY_KINDS, key_of, print_table  # noqa: E402

from rockstate.cluster import protocol as p  # noqa: E402
from rockstate.local.cluster import LocalCluster  # noqa: E402
from rockstate.keys import partition_of  # noqa: E402
from rockstate.rpc.client import Channel  # noqa: E402
from rockstate.serde import encode_key, encode_value  # noqa: E402
from rockstate.store import PUT, PUT_MANY, requests  # noqa: E402

CALLS = int(os.environ.get("BENCH_IDS_CALLS", "3000"))
BATCHES = int(os.environ.get("BENCH_IDS_BATCHES", "50"))
CHUNK = 250
BATCH = 1000
REPEAT = 3
PARTITIONS = 16
GOAL_COST = 0.10  # at most 10% slower with ids, on either workload


def main() -> None:
    rows = []
    with LocalCluster(nodes=1, partitions=PARTITIONS) as cluster, cluster.connect() as rs:
        for kind in KEY_KINDS:
            rows += measure(cluster, rs, kind)
    print_table(f"request ids: {CALLS} one-key puts and {REPEAT}x{BATCHES} batches of {BATCH} per side and key kind, 1 node",
                ["workload", "with id", "without", "cost", "goal", "met"], rows)


def measure(cluster, rs, kind: str) -> list[list]:
    state_name = f"bench-{kind}"
    rs.value_state(state_name, create=True)  # raw writes below go to it
    epoch = rs.backend.refresh().epoch
    keys = (key_of(kind, i) for i in itertools.count())
    value = encode_value(b"v" * 100)
    written: dict[bool, list[int]] = {True: [], False: []}
    with Channel(cluster.nodes()[0].address) as channel:

        def send(groups: dict[int, list], with_id: bool) -> None:
            channel.call(p.Write(epoch=epoch, groups=[[pid, ops] for pid, ops in groups.items()],
                                 request=requests.new_id() if with_id else None))

        def one_put(with_id: bool) -> int:
            k = next(keys)
            start = time.perf_counter_ns()
            send({partition_of(k, PARTITIONS): [(PUT, state_name, encode_key(k), value)]}, with_id)
            written[with_id].append(k)
            return time.perf_counter_ns() - start

        def batches(with_id: bool) -> float:
            prepared = []
            for _ in range(BATCHES):
                groups: dict[int, list] = {}
                for k in itertools.islice(keys, BATCH):
                    groups.setdefault(partition_of(k, PARTITIONS), []).append(k)
                    written[with_id].append(k)
                prepared.append({pid: [(PUT_MANY, state_name, [encode_key(k) for k in ks], [value] * len(ks))]
                                 for pid, ks in groups.items()})
            start = time.perf_counter()
            for groups in prepared:
                send(groups, with_id)
            return BATCHES * BATCH / (time.perf_counter() - start)

        for with_id in (True, False):  # warm-up
            for _ in range(CHUNK):
                one_put(with_id)
        written = {True: [], False: []}
        latencies: dict[bool, list[int]] = {True: [], False: []}
        for _ in range(CALLS // CHUNK):
            for with_id in (True, False):
                latencies[with_id] += [one_put(with_id) for _ in range(CHUNK)]
        rates: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(REPEAT):
            for with_id in (True, False):
                rates[with_id].append(batches(with_id))
    state = rs.value_state(state_name)
    for with_id, ks in written.items():
        stored = state.get_many(ks)
        assert all(v == b"v" * 100 for v in stored), f"a write {'with' if with_id else 'without'} an id is missing"

    def pct(samples: list[int], q: float) -> float:
        return statistics.quantiles(samples, n=100)[int(q) - 1] / 1000

    rows = []
    for name, ours, plain, lower_is_better in (
        ("put 1 key p50 (µs)", pct(latencies[True], 50), pct(latencies[False], 50), True),
        ("put 1 key p99 (µs)", pct(latencies[True], 99), pct(latencies[False], 99), True),
        ("put batch 1000 (keys/s)", statistics.median(rates[True]), statistics.median(rates[False]), False),
    ):
        cost = ours / plain - 1 if lower_is_better else plain / ours - 1
        goal = "p99 not a goal" if "p99" in name else f"cost <= {GOAL_COST:.0%}"
        met = "" if "p99" in name else ("yes" if cost <= GOAL_COST else "NO")
        rows.append([f"{kind}: {name}", ours, plain, f"{cost:+.1%}", goal, met])
    return rows


if __name__ == "__main__":
    main()
