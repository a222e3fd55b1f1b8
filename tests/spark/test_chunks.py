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
