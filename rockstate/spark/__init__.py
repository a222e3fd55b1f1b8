"""rockstate for PySpark: co-partitioning and a keyed stateful operator with state in a rockstate cluster.

``with_partition`` adds each row's rockstate partition, computed by Spark SQL;
``transform_with_state`` runs a ``StatefulProcessor`` over a batch or
streaming DataFrame, reading and writing its state in batches (one request
per owner per batch, never one per key).

``bulk_load`` writes a DataFrame into a state as sorted SST files, and
``spark.read.format("rockstate")`` (after ``register_data_source(spark)``)
reads a state of a checkpoint back as a DataFrame (Spark 4.0+: the Python
Data Source API).

Supported: PySpark 3.5 through 4.3. Importing this package on any other
raises ``UnsupportedSparkError`` (an ``ImportError``) naming the range.
"""

from .version import SPARK_HAS_DATA_SOURCE, SPARK_VERSION, SUPPORTED_RANGE, UnsupportedSparkError  # first: the check
from .batch import BatchWriter
from .bulk import BulkLoadResult, bulk_load
from ..errors import StateAheadError, StateRewoundError, UnsupportedClientError, UnsupportedShapeError
from .client import StateClientSpec, close_clients
if SPARK_HAS_DATA_SOURCE:
    from .datasource import RockstateDataSource, register_data_source
else:  # Spark 3.5: no pyspark.sql.datasource; the rest of the package works

    def register_data_source(spark):  # type: ignore[no-redef]
        raise UnsupportedSparkError(f"spark.read.format('rockstate') needs Spark 4.0 or later (the Python Data Source "
                                    f"API); this is PySpark {spark.version}", supported=">=4.0,<4.4")

    def __getattr__(name: str):
        if name == "RockstateDataSource":
            raise UnsupportedSparkError("RockstateDataSource needs Spark 4.0 or later (the Python Data Source API)",
                                        supported=">=4.0,<4.4")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
from .exactly_once import ExactlyOnce, ParquetSink, exactly_once
from .microbatch import WeakerGuaranteeWarning, settle
from .operator import state_name, transform_with_state
from .partitioning import PARTITION_COLUMN, with_partition
from .clock import late_rows
from .handles import ListStateHandle, MapStateHandle, ValueStateHandle
from .processor import StatefulProcessor, StatefulProcessorHandle
from .timers import ExpiredTimerInfo, TimerValues

__all__ = [
    "BatchWriter",
    "BulkLoadResult",
    "RockstateDataSource",
    "bulk_load",
    "register_data_source",
    "ExactlyOnce",
    "ExpiredTimerInfo",
    "TimerValues",
    "late_rows",
    "ParquetSink",
    "SPARK_VERSION",
    "SUPPORTED_RANGE",
    "StateAheadError",
    "StateRewoundError",
    "UnsupportedShapeError",
    "exactly_once",
    "ListStateHandle",
    "MapStateHandle",
    "PARTITION_COLUMN",
    "StateClientSpec",
    "StatefulProcessor",
    "StatefulProcessorHandle",
    "UnsupportedClientError",
    "UnsupportedSparkError",
    "ValueStateHandle",
    "close_clients",
    "settle",
    "state_name",
    "transform_with_state",
    "WeakerGuaranteeWarning",
    "with_partition",
]
