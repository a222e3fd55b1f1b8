"""What differs between the supported Spark lines (3.5 through 4.3), in one place."""

from __future__ import annotations

import inspect

import pyarrow as pa
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema as _to_arrow_schema

# Spark 4.3's to_arrow_schema needs the time zone of timestamp columns; before it, they were always UTC
_TAKES_TIMEZONE = "timezone" in inspect.signature(_to_arrow_schema).parameters


def to_arrow_schema(schema: T.StructType) -> pa.Schema:
    """The Arrow schema of a Spark schema, timestamps in UTC (what mapInArrow exchanges), on every Spark line."""
    if _TAKES_TIMEZONE:
        return _to_arrow_schema(schema, timezone="UTC")
    return _to_arrow_schema(schema)
