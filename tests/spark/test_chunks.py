"""A task's Arrow batches regrouped into sorted chunks of whole keys (``spark/chunks.py``), on the pinned pyarrow."""

import warnings

import pyarrow as pa

from rockstate.spark.chunks import chunks


def test_chunks_sort_by_partition_then_key_with_nulls_first_and_no_warning():
    batches = [pa.RecordBatch.from_pydict({"p": [1, 0, 1], "k": [None, 2, 1]}),
               pa.RecordBatch.from_pydict({"p": [0, 1, 0], "k": [None, None, 2]})]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # pyarrow >= 25 deprecates one null placement for all keys: a warning per chunk
        out = list(chunks(iter(batches), "p", ["k"], 1 << 20))
    table = pa.concat_tables([t for t, _ in out])
    assert table.to_pydict() == {"p": [0, 0, 0, 1, 1, 1], "k": [None, 2, 2, None, None, 1]}
    assert sum(len(starts) for _, starts in out) == 4  # (0, null) (0, 2) (1, null) (1, 1): one group each


def test_without_groups_a_whole_input_keeps_its_order_and_a_cut_one_keeps_keys_whole():
    batches = [pa.RecordBatch.from_pydict({"p": [1, 0, 1], "k": [3.0, -0.0, 1.0]}),
               pa.RecordBatch.from_pydict({"p": [0, 1, 0], "k": [2.0, 3.0, 0.0]})]
    [(table, starts)] = chunks(iter(batches), "p", ["k"], 1 << 20, groups=False)
    assert starts is None  # a vectorized processor takes the rows of many keys at once: no sort needed
    assert table.to_pydict() == {"p": [1, 0, 1, 0, 1, 0], "k": [3.0, 0.0, 1.0, 2.0, 3.0, 0.0]}  # -0.0 is 0.0, as Spark groups
    many = [pa.RecordBatch.from_pydict({"p": [i % 2] * 4, "k": [float(i % 3)] * 4}) for i in range(30)]
    out = list(chunks(iter(many), "p", ["k"], 200, groups=False))
    assert len(out) > 1 and sum(t.num_rows for t, _ in out) == 120
    for table, _ in out[:-1]:  # past max_bytes: sorted, so the chunk's last key is held back for the next one
        rows = list(zip(*table.select(["p", "k"]).to_pydict().values()))
        assert rows == sorted(rows)
