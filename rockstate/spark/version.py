"""Which PySpark the operator runs on: 3.5 through 4.3, checked when ``rockstate.spark`` is imported.

The operator rests on what every supported line has: ``mapInArrow`` (Spark 3.3+),
``foreachBatch``, and the task properties ``sql.streaming.queryId`` and
``streaming.sql.batchId`` that exactly-once versions the state by. The Python
Data Source API (``spark.read.format("rockstate")``) is Spark 4.0+:
``SPARK_HAS_DATA_SOURCE`` says whether this Spark has it.
"""

from __future__ import annotations

import re

from ..errors import UnsupportedSparkError

SUPPORTED = ((3, 5), (4, 3))  # the first and last supported minor versions, both included
SUPPORTED_RANGE = "PySpark 3.5 through 4.3 (>=3.5,<4.4)"


def parse(version: str) -> tuple[int, int]:
    """(major, minor) of a PySpark version string such as ``4.0.1``, ``3.5.9`` or ``4.3.0.dev0``."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise UnsupportedSparkError(f"rockstate.spark supports {SUPPORTED_RANGE}; cannot read PySpark's version "
                                    f"{version!r}", version=version)
    return int(match.group(1)), int(match.group(2))


def check(version: str) -> tuple[int, int]:
    """(major, minor) of ``version`` if rockstate supports it, else ``UnsupportedSparkError`` naming the range."""
    found = parse(version)
    if not SUPPORTED[0] <= found <= SUPPORTED[1]:
        raise UnsupportedSparkError(
            f"rockstate.spark supports {SUPPORTED_RANGE}; PySpark {version} is installed. "
            f"Install a supported one, e.g. pip install 'rockstate[spark]' (it picks one in the range)",
            version=version, supported=SUPPORTED_RANGE)
    return found


def _installed() -> str:
    try:
        import pyspark
    except ImportError as e:
        raise UnsupportedSparkError(f"rockstate.spark needs {SUPPORTED_RANGE}; PySpark is not installed "
                                    f"(pip install 'rockstate[spark]')", supported=SUPPORTED_RANGE) from e
    return pyspark.__version__


SPARK_VERSION = check(_installed())
SPARK_HAS_DATA_SOURCE = SPARK_VERSION >= (4, 0)  # pyspark.sql.datasource: the Python Data Source API
