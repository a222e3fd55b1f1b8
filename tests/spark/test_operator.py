"""transform_with_state on batch DataFrames: running counts, map and list state, batched requests."""

import json
import os
import sys
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.errors import PythonException

import rockstate
from rockstate.errors import InvalidInputError
from rockstate.spark import StateClientSpec, StatefulProcessor, UnsupportedClientError, transform_with_state

pytestmark = pytest.mark.filterwarnings("ignore::rockstate.spark.WeakerGuaranteeWarning")  # batch DataFrames: at least once, as test_shapes asserts

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors cannot import the tests

rng = np.random.default_rng(11)


def events(spark, rows=20_000, users=1_500):
    pdf = pd.DataFrame({
        "user": [f"u{i}" for i in rng.integers(0, users, rows)],
        "n": rng.integers(0, 3, rows).astype(np.int32),
        "item": rng.choice(["apple", "pear", "plum", "kiwi"], rows),
        "qty": rng.integers(1, 10, rows),
    })
    return pdf, spark.createDataFrame(pdf)


class VectorCount(StatefulProcessor):
    """Running count per key, vectorized: one get_many and one put_many per batch."""

    def __init__(self, state, keys):
        self.state, self.keys = state, keys

    def init(self, handle):
        self.counts = handle.value_state(self.state)

    def handle_batch(self, batch):
        sizes = batch.groupby(self.keys, sort=False).size()
        counts = np.asarray(self.counts.get_many(sizes.index, default=0)) + sizes.to_numpy()
        self.counts.put_many(sizes.index, counts)
        return sizes.index.to_frame(index=False).assign(count=counts)


class RowsCount(StatefulProcessor):
    """Running count per key, the transformWithStateInPandas way."""

    def __init__(self, state):
        self.state = state

    def init(self, handle):
        self.counts = handle.value_state(self.state)

    def handle_input_rows(self, key, rows):
        rows = list(rows)
        count = self.counts.get(0) + sum(len(r) for r in rows)
        self.counts.update(count)
        user, n = key
        yield pd.DataFrame({"user": [user], "n": [n], "count": [count], "index0": [int(rows[0].index[0])]})


def expected_counts(pdf, keys):
    return pdf.groupby(keys).size().rename("count").reset_index()


def sorted_frame(df, keys):
    return df.sort_values(keys).reset_index(drop=True)


def test_running_count_handle_batch(spark, cluster, rs):
    pdf, df = events(spark)
    expected = sorted_frame(expected_counts(pdf, ["user"]), ["user"])
    for run in (1, 2):  # the second run counts on top of the first one's state
        out = transform_with_state(df, "user", VectorCount("vec-count", "user"), "user string, count long", cluster.address).toPandas()
        assert out["user"].is_unique  # every row of a key arrived in one batch
        got = sorted_frame(out, ["user"])
        assert got["user"].tolist() == expected["user"].tolist()
        assert got["count"].tolist() == (expected["count"] * run).tolist()
    state = rs.value_state("vec-count")
    assert state.get_many(expected["user"]) == (expected["count"] * 2).tolist()
    assert state.count() == len(expected)


def test_running_count_handle_input_rows_with_two_key_columns(spark, cluster, rs):
    pdf, df = events(spark)
    keys = ["user", "n"]
    expected = sorted_frame(expected_counts(pdf, keys), keys)
    schema = "user string, n int, count long, index0 long"
    for run in (1, 2):
        # a small batch budget: many chunks per task, yet one call per key (Spark sorted the task's rows)
        out = transform_with_state(df, keys, RowsCount("rows-count"), schema, rs, max_batch_bytes=32 << 10).toPandas()
        assert not out.duplicated(keys).any()
        assert (out["index0"] == 0).all()  # each key's rows are numbered from 0, as in Spark
        got = sorted_frame(out, keys)
        assert got[keys].values.tolist() == expected[keys].values.tolist()
        assert got["count"].tolist() == (expected["count"] * run).tolist()
    state_keys = [(u, int(n)) for u, n in expected[keys].itertuples(index=False)]
    assert rs.value_state("rows-count").get_many(state_keys) == (expected["count"] * 2).tolist()


class Baskets(StatefulProcessor):
    """Per user: every item seen (list state) and the quantity per item (map state)."""

    def init(self, handle):
        self.seen = handle.list_state("seen")
        self.basket = handle.map_state("basket")

    def handle_input_rows(self, key, rows):
        for frame in rows:
            self.seen.append_list(frame["item"].tolist())
            for item, qty in zip(frame["item"], frame["qty"].tolist()):
                self.basket.update_value(item, self.basket.get_value(item, 0) + qty)
        if self.basket.contains_key("kiwi"):
            self.basket.remove_key("kiwi")
        items = list(self.seen.get())
        yield pd.DataFrame({"user": [key[0]], "seen": [len(items)], "total": [sum(self.basket.values())],
                            "kinds": [",".join(sorted(self.basket.keys()))]})


class VectorBaskets(StatefulProcessor):
    """The same state, vectorized; kiwis clear the user's basket."""

    def init(self, handle):
        self.seen = handle.list_state("vseen")
        self.basket = handle.map_state("vbasket")

    def handle_batch(self, batch):
        self.seen.append_many(batch["user"], batch["item"])
        sums = batch.groupby(["user", "item"]).qty.sum().reset_index()
        old = self.basket.get_many(sums["user"], sums["item"], default=0)
        self.basket.put_many(sums["user"], sums["item"], (np.asarray(old) + sums["qty"]).tolist())
        self.basket.clear_many(batch.loc[batch["item"] == "kiwi", "user"].unique())
        lists = self.seen.get_many(batch["user"].unique())
        return pd.DataFrame({"user": batch["user"].unique(), "seen": [len(items) for items in lists]})


def test_map_and_list_state(spark, cluster, rs):
    pdf, df = events(spark, rows=3000, users=200)
    out = transform_with_state(df, "user", Baskets(), "user string, seen long, total long, kinds string", cluster.address).toPandas()
    per_user = pdf.groupby("user")
    assert dict(zip(out["user"], out["seen"])) == per_user.size().to_dict()
    no_kiwi = pdf[pdf["item"] != "kiwi"]
    assert dict(zip(out["user"], out["total"])) == {u: int(no_kiwi[no_kiwi.user == u].qty.sum()) for u in per_user.groups}
    seen, basket = rs.list_state("seen"), rs.map_state("basket")
    for user, rows in list(per_user)[:50]:
        assert sorted(seen.get(user)) == sorted(rows["item"])
        assert dict(basket.items(user)) == rows[rows.item != "kiwi"].groupby("item").qty.sum().to_dict()

    out = transform_with_state(df, "user", VectorBaskets(), "user string, seen long", cluster.address).toPandas()
    assert dict(zip(out["user"], out["seen"])) == per_user.size().to_dict()
    vseen, vbasket = rs.list_state("vseen"), rs.map_state("vbasket")
    for user, rows in list(per_user)[:50]:
        assert sorted(vseen.get(user)) == sorted(rows["item"])
        want = {} if (rows.item == "kiwi").any() else rows.groupby("item").qty.sum().to_dict()
        assert dict(vbasket.items(user)) == want


@dataclass(frozen=True)
class CountingSpec(StateClientSpec):
    """Connects like a StateClientSpec; the workers' backends log every request they make."""

    log_dir: str = ""

    def open_backend(self):
        return CountingBackend(super().open_backend(), self.log_dir)


class CountingBackend:
    def __init__(self, inner, log_dir):
        self._inner, self._log = inner, os.path.join(log_dir, f"{os.getpid()}.jsonl")

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def _record(self, op, groups):
        with open(self._log, "a") as f:
            f.write(json.dumps({"op": op, "pids": sorted(groups), "keys": sum(len(v) for v in groups.values())}) + "\n")

    def write(self, ops_by_pid):
        keys = {pid: [k for op in ops for k in (op[2] if isinstance(op[2], list) else [op[2]])] for pid, ops in ops_by_pid.items()}
        self._record("write", keys)
        return self._inner.write(ops_by_pid)

    def get_many(self, state, keys_by_pid):
        self._record("get_many", keys_by_pid)
        return self._inner.get_many(state, keys_by_pid)

    def read_runs(self, state, pids, counts, keys):
        self._record("get_many", {pid: [None] * count for pid, count in zip(pids, counts)})
        return self._inner.read_runs(state, pids, counts, keys)


def logged(log_dir):
    return [json.loads(line) for name in os.listdir(log_dir) for line in open(os.path.join(log_dir, name))]


@pytest.mark.parametrize("processor", [RowsCount("batched-rows"), VectorCount("batched-vec", ["user", "n"])], ids=["per-key", "vectorized"])
def test_one_read_and_one_write_per_batch_not_per_key(spark, cluster, rs, tmp_path, processor):
    pdf, df = events(spark)
    spec = CountingSpec(cluster.address, log_dir=str(tmp_path))
    out = transform_with_state(df, ["user", "n"], processor, "user string, n int, count long", spec, max_batch_bytes=64 << 10)
    assert out.count() == pdf.groupby(["user", "n"]).ngroups  # consume the output: the operator must run
    calls = logged(tmp_path)
    writes = [c for c in calls if c["op"] == "write"]
    reads = [c for c in calls if c["op"] == "get_many"]
    keys = pdf.groupby(["user", "n"]).ngroups
    assert sum(c["keys"] for c in writes) == keys  # every key written once...
    assert len(writes) == len(reads)  # ...by one write per batch, after one read per batch
    assert 4 <= len(writes) <= 40 < keys // 50  # several batches per task, far fewer requests than keys
    owners = rs.backend.table.owners
    assert all(len({owners[pid] for pid in c["pids"]}) == 1 for c in calls)  # each task talks to one owner


class Misuse(StatefulProcessor):
    def init(self, handle):
        self.counts = handle.value_state("misuse")

    def handle_batch(self, batch):
        self.counts.get()  # no current key in handle_batch


class Both(Misuse):
    def handle_input_rows(self, key, rows):
        yield from ()


def test_misuse_is_refused_with_clear_errors(spark, cluster, tmp_path):
    _, df = events(spark, rows=100)
    with rockstate.open(str(tmp_path / "embedded"), partitions=8) as embedded:
        with pytest.raises(UnsupportedClientError, match="embedded"):
            transform_with_state(df, "user", Misuse(), "user string", embedded)
    with pytest.raises(UnsupportedClientError):
        transform_with_state(df, "user", Misuse(), "user string", object())
    with pytest.raises(InvalidInputError, match="exactly one"):
        transform_with_state(df, "user", Both(), "user string", cluster.address)
    with pytest.raises(PythonException, match="only inside handle_input_rows"):
        transform_with_state(df, "user", Misuse(), "user string", cluster.address).collect()
