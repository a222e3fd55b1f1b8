"""A processor state's values: untyped or typed by a Spark SQL schema, and Spark's TTL.

Untyped (no schema): any rockstate value; numpy and pandas scalars coming
out of a pandas batch are turned into Python ones on the way in.

Typed (a ``StructType`` or a DDL string, as Spark's ``getValueState(name,
schema)`` takes): a value is a tuple, list, ``Row`` or dict of the schema's
fields (a bare scalar for a one-field schema), checked against the schema
and stored in Spark's internal form (``StructType.toInternal``: timestamps
as microseconds, dates as days, nested structs as tuples), so numbers of
every width, strings, binary, booleans, timestamps, dates, decimals, arrays,
maps and nested structs all fit. It comes back as Spark gives it: a ``Row``
(a tuple: ``get()[0]``, ``== (1,)``), with nested structs as ``Row``\\ s.
A schema may gain nullable fields at its end (old values read with None
there); any other change is refused with ``StateSchemaError``.

TTL, as Spark counts it: a write stores the value with its expiry, the
batch's timestamp plus the TTL; a read in a batch whose timestamp has
reached the expiry sees nothing. Each list element carries its own expiry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import types as T

from ..errors import InvalidInputError, InvalidValueError, StateSchemaError
from ..serde import decode_stream, decode_value, decode_values, encode_value, encode_values

Schema = T.StructType | str | None


def plain(value: Any) -> Any:
    """``value`` with numpy / pandas scalars and arrays turned into Python ones (recursively)."""
    if isinstance(value, np.generic):
        if isinstance(value, np.datetime64):
            return pd.Timestamp(value).to_pydatetime()
        return value.item()
    if isinstance(value, pd.Timestamp):
        return value.to_pydatetime()
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()]
    if isinstance(value, T.Row):
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    return value


def struct_of(schema: Any, parsed: dict[str, T.StructType], what: str) -> T.StructType | None:
    """``schema`` as a StructType: a DDL string is looked up among those the operator parsed on the driver."""
    if schema is None or isinstance(schema, T.StructType):
        return schema
    if isinstance(schema, str):
        if schema in parsed:
            return parsed[schema]
        try:
            parsed[schema] = T._parse_datatype_string(schema)  # needs a SparkContext (the driver)
            return struct_of(parsed[schema], parsed, what)
        except Exception:
            raise InvalidInputError(
                f"{what}: the DDL schema {schema!r} was not parsed; transform_with_state parses the schemas its "
                "processor's init() asks for on the driver: ask for the same string there, or pass a StructType"
            ) from None
    if isinstance(schema, T.DataType):
        return T.StructType([T.StructField("value", schema)])
    raise InvalidInputError(f"{what}: a schema is a StructType or a DDL string such as 'count bigint', got {schema!r}")


def check_evolution(state: str, stored: T.StructType, wanted: T.StructType) -> None:
    """Refuse a schema change other than adding nullable fields at the end."""
    if stored == wanted:
        return
    old, new = stored.fields, wanted.fields
    grown = len(new) > len(old) and [(f.name, f.dataType) for f in new[:len(old)]] == [(f.name, f.dataType) for f in old]
    if grown and all(f.nullable for f in new[len(old):]):
        return
    raise StateSchemaError(
        f"state {state!r} holds values of schema {stored.simpleString()}; it cannot be read as "
        f"{wanted.simpleString()}: only nullable fields added at the end are allowed. Keep the schema, "
        "or use a new state name (and delete_if_exists the old one)",
        state=state,
    )


class StateCodec:
    """Encodes and decodes one state's values (and a map state's user keys); ``clock()`` is the batch's time in ms."""

    def __init__(self, state: str, schema: T.StructType | None, ttl_ms: int | None, clock: Callable[[], int],
                 limit: int, key_schema: T.StructType | None = None) -> None:
        self.state, self.schema, self.ttl_ms, self.clock, self.limit = state, schema, ttl_ms, clock, limit
        self.key_schema = key_schema
        self._verify = None if schema is None else T._make_type_verifier(schema, name=f"state {state!r}")
        self._verify_key = None if key_schema is None else T._make_type_verifier(key_schema, name=f"state {state!r} user key")

    @property
    def plain(self) -> bool:
        """Values are stored as given: the fast vectorized path applies."""
        return self.schema is None and self.ttl_ms is None

    # -- values ------------------------------------------------------------

    def _internal(self, value: Any, schema: T.StructType | None, verify: Callable | None) -> Any:
        value = plain(value)
        if schema is None:
            return value
        if not isinstance(value, (tuple, list, dict)) and len(schema.fields) == 1:
            value = (value,)
        try:
            verify(value)
        except (TypeError, ValueError) as exc:
            raise InvalidValueError(f"state {self.state!r}: {value!r:.200} does not fit {schema.simpleString()}: {exc}") from None
        if isinstance(value, dict) and not isinstance(value, T.Row):
            value = tuple(value.get(f.name) for f in schema.fields)
        return list(schema.toInternal(value))

    def _external(self, internal: Any, schema: T.StructType | None) -> Any:
        if schema is None:
            return internal
        missing = len(schema.fields) - len(internal)
        if missing > 0:  # written before nullable fields were added
            internal = [*internal, *([None] * missing)]
        return schema.fromInternal(internal)

    def encode(self, value: Any) -> bytes:
        internal = self._internal(value, self.schema, self._verify)
        if self.ttl_ms is not None:
            internal = [self.clock() + self.ttl_ms, internal]
        return encode_value(internal, self.limit)

    def encode_many(self, values: Iterable[Any], keys: list | None = None) -> list[bytes]:
        """``keys``: the values' keys, to name the bad one."""
        values = values if isinstance(values, list) else list(values)
        if self.plain:
            try:
                return encode_values(values, self.limit)
            except InvalidValueError:  # numpy or pandas scalars, from a pandas batch
                return encode_values([plain(v) for v in values], self.limit, keys)
        return [self.encode(v) for v in values]

    def decode(self, data: bytes | None) -> Any:
        """The value, or None when absent or expired."""
        if data is None:
            return None
        internal = decode_value(data)
        if self.ttl_ms is not None:
            expiry, internal = internal
            if expiry <= self.clock():
                return None
        return self._external(internal, self.schema)

    def decode_many(self, datas: list[bytes | None], default: Any = None) -> list[Any]:
        """``decode`` of each, ``default`` for the absent or expired; a plain codec's as one stream."""
        if self.plain:
            return decode_values(datas, default)
        return [default if v is None else v for v in map(self.decode, datas)]

    def decode_list(self, data: bytes | None) -> list[Any]:
        """A list state's live elements."""
        if not data:
            return []
        items = decode_stream(data)
        if self.ttl_ms is not None:
            now = self.clock()
            items = [v for expiry, v in items if expiry > now]
        if self.schema is None:
            return items
        return [self._external(v, self.schema) for v in items]

    def live_list(self, data: bytes | None) -> bytes:
        """A list state's stored bytes without its expired elements (what an append extends)."""
        if not data or self.ttl_ms is None:
            return data or b""
        now = self.clock()
        return b"".join(encode_value(item, self.limit) for item in decode_stream(data) if item[0] > now)

    # -- a map state's user keys ---------------------------------------------

    def user_key(self, user_key: Any) -> Any:
        """The user key as rockstate encodes it (a typed key: its fields' internal values, as a tuple)."""
        if self.key_schema is None:
            return plain(user_key)
        return tuple(self._internal(user_key, self.key_schema, self._verify_key))

    def user_key_out(self, decoded: Any) -> Any:
        if self.key_schema is None:
            return decoded
        return self._external(list(decoded) if isinstance(decoded, tuple) else [decoded], self.key_schema)

