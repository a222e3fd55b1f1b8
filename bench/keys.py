"""The key path alone: encoding keys and finding their partitions, per key kind, in one process.

For each key kind (ints, 36-character UUID strings, (tenant id, int) tuples)
and input form (a Python list; a numpy array or pandas Index where the kind
has one; an Arrow array), ``prepare_keys`` (what every ``get_many``,
``put_many`` and ``delete_many`` runs: msgpack encoding plus Spark's Murmur3
per key) against the per-key reference it replaced (``encode_key`` and
``partition_of`` in a Python loop). Best of REPEAT runs over N keys, in µs per
key; "x int" is a kind's cost over int keys in the same form (goal <= 1.2).
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402

from common import COMPARED_KINDS, make_keys, print_table  # noqa: E402
from rockstate.keys import partition_of  # noqa: E402
from rockstate.serde import encode_key  # noqa: E402
from rockstate.states import prepare_keys  # noqa: E402

N = int(os.environ.get("BENCH_KEY_PATH_KEYS", 20_000))
REPEAT = 9
P = 128
LIMIT = 1 << 20


def best_us_per_key(fn, n: int) -> float:
    times = []
    for _ in range(REPEAT):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) / n * 1e6


def forms(kind: str, keys: list) -> dict:
    out = {"list": keys}
    if kind.startswith("int"):
        out["numpy"] = np.array(keys, dtype=np.int64)
    elif kind == "uuid":
        out["pandas Index"] = pd.Index(keys)
        out["Arrow"] = pa.array(keys)
    return out


def main() -> None:
    rows = []
    for kind in COMPARED_KINDS:
        keys = make_keys(kind, N)
        expected = prepare_keys(keys, P, LIMIT)
        reference = best_us_per_key(lambda: ([encode_key(k) for k in keys], [partition_of(k, P) for k in keys]), N)
        for form, value in forms(kind, keys).items():
            encoded, pids = prepare_keys(value, P, LIMIT)
            assert encoded == expected[0] and pids.tolist() == expected[1].tolist(), f"{kind} {form}: other keys or partitions"
            ours = best_us_per_key(lambda: prepare_keys(value, P, LIMIT), N)
            rows.append([kind, form, ours, reference, reference / ours])
    int_list = next(row[2] for row in rows if row[:2] == ["int", "list"])
    rows = [[*row, row[2] / int_list] for row in rows]
    print_table(
        f"key path: prepare_keys (encode + Spark partition, column-wise) vs the per-key loop, {N:,} keys, P={P}, "
        f"best of {REPEAT} (goal: x int <= 1.2)",
        ["keys", "form", "µs/key", "per-key loop µs/key", "speed-up", "x int (list)"],
        rows,
    )


if __name__ == "__main__":
    main()
