"""One batch shape on every handle: the Spark processor's handles take what the plain states take.

The handles run over an embedded store (real RocksDB), in the micro-batch
machinery the operator uses, without Spark: a handle and a plain state must
write the same keys to the same partitions.
"""

import datetime as dt
import uuid

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import rockstate
from rockstate.errors import InvalidInputError, InvalidValueError
from rockstate.spark.batch import Batch, BatchWriter
from rockstate.spark.processor import StatefulProcessorHandle

KEYS = [str(uuid.UUID(int=i * 104729)) for i in range(50)]
VALUES = [{"n": i, "at": dt.datetime(2024, 1, 1, i % 24), "pair": (i, -i)} for i in range(50)]


@pytest.fixture
def rs(tmp_path):
    with rockstate.open(str(tmp_path / "db"), partitions=8) as handle:
        yield handle


def in_batch(rs, work):
    """Run ``work(handle)`` as one micro-batch of a processor, then write the batch back."""
    handle = StatefulProcessorHandle(rs.backend)
    backend = rs.backend
    handle.begin(Batch(backend, BatchWriter(backend)))
    try:
        return work(handle)
    finally:
        handle.finish()


SHAPES = {
    "keys, values": lambda: (KEYS, VALUES),
    "mapping": lambda: (dict(zip(KEYS, VALUES)),),
    "pairs": lambda: (list(zip(KEYS, VALUES)),),
    "numpy keys": lambda: (np.array(KEYS), VALUES),
    "pandas index, series": lambda: (pd.Index(KEYS), pd.Series(VALUES)),
    "series as mapping": lambda: (pd.Series(VALUES, index=KEYS),),
    "arrow keys": lambda: (pa.array(KEYS), VALUES),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_spark_handles_take_every_batch_shape(rs, shape):
    in_batch(rs, lambda h: h.value_state("v").put_many(*SHAPES[shape]()))
    assert rs.value_state("v").get_many(KEYS) == VALUES  # the plain state finds what the handle wrote
    got = in_batch(rs, lambda h: h.value_state("v").get_many(pa.array(KEYS)))
    assert got == VALUES
    in_batch(rs, lambda h: h.value_state("v").delete_many(pd.Series(KEYS)))
    assert rs.value_state("v").count() == 0


@pytest.mark.parametrize("shape", SHAPES)
def test_plain_states_take_every_batch_shape(rs, shape):
    rs.value_state("v").put_many(*SHAPES[shape]())
    assert in_batch(rs, lambda h: h.value_state("v").get_many(KEYS)) == VALUES


def test_spark_handles_name_the_bad_item(rs):
    values = list(VALUES)
    values[17] = {1, 2}
    with pytest.raises(InvalidValueError, match=f"value of key '{KEYS[17]}' \\(index 17\\)"):
        in_batch(rs, lambda h: h.value_state("v").put_many(KEYS, values))
    with pytest.raises(InvalidInputError, match="50 keys but 3 values"):
        in_batch(rs, lambda h: h.value_state("v").put_many(KEYS, [1, 2, 3]))
    assert rs.value_state("v").count() == 0
