"""msgpack extension types: the values a pipeline has beyond msgpack's own, and users' codecs.

Each type is one msgpack ext code, so data written before a type existed
decodes as it always did. Codes 0..63 are rockstate's, 64..127 the users'
(``register_codec``). Payloads, all big-endian:

==  ==========  ===============================================================
 1  datetime    ``>qH`` microseconds since 1970-01-01 (UTC for an aware one,
                wall-clock for a naive one), extra nanoseconds (a pandas
                Timestamp's); then the zone: empty (naive), an IANA name, or
                ``UTC+HH:MM[:SS[.ffffff]]`` for a fixed offset
 2  date        ``>i`` days since 1970-01-01
 3  time        ``>q`` microseconds since midnight; zone as for datetime
 4  timedelta   ``>qqH`` days, microseconds within the day, extra nanoseconds
 5  Decimal     its ``str()`` in ASCII (exact, NaN and Infinity included)
 6  UUID        its 16 bytes
 7  tuple       the msgpack array of its items (values only: a key's tuple is an array)
==  ==========  ===============================================================

A datetime, time or timedelta with nanoseconds comes back as the pandas type;
numpy and Arrow scalars come back as their Python equivalents.
"""

from __future__ import annotations

import datetime as dt
import struct
import uuid
from decimal import Decimal
from typing import Any, Callable

import msgpack
import numpy as np

from .errors import ConfigError

DATETIME, DATE, TIME, TIMEDELTA, DECIMAL, UUID, TUPLE = range(1, 8)
USER_CODES = range(64, 128)

EPOCH = dt.datetime(1970, 1, 1)
EPOCH_UTC = EPOCH.replace(tzinfo=dt.timezone.utc)
EPOCH_DATE = EPOCH.date()
_US = dt.timedelta(microseconds=1)
_DAY_US = 86_400_000_000
_Q, _QH, _I, _QQH = struct.Struct(">q"), struct.Struct(">qH"), struct.Struct(">i"), struct.Struct(">qqH")

# type -> (code, encode), and code -> decode, for users' types
_user_encoders: dict[type, tuple[int, Callable[[Any], bytes]]] = {}
_user_decoders: dict[int, Callable[[bytes], Any]] = {}


def register_codec(cls: type, code: int, encode: Callable[[Any], bytes], decode: Callable[[bytes], Any]) -> None:
    """Store values of ``cls`` (and its subclasses) as msgpack ext type ``code`` (64..127).

    ``encode(value) -> bytes`` and ``decode(bytes) -> value``; register the
    same codec in every process that reads or writes such values (Spark
    executors included). Such values are values only, not keys.
    """
    if not isinstance(code, int) or code not in USER_CODES:
        raise ConfigError(f"a user codec's code must be an int in 64..127, got {code!r}")
    taken = next((c for c, (n, _) in _user_encoders.items() if n == code and c is not cls), None)
    if taken is not None:
        raise ConfigError(f"ext code {code} is taken by {taken.__name__}; choose another in 64..127")
    _user_encoders[cls] = (code, encode)
    _user_decoders[code] = decode


# -- zones ---------------------------------------------------------------------


def _zone_name(tz: dt.tzinfo | None, value: dt.datetime | dt.time) -> bytes:
    if tz is None:
        return b""
    if tz is dt.timezone.utc:
        return b"UTC"
    key = getattr(tz, "key", None) or getattr(tz, "zone", None)  # zoneinfo, pytz
    if isinstance(key, str):
        return key.encode()
    offset = value.utcoffset()
    sign = "-" if offset < dt.timedelta(0) else "+"
    return f"UTC{sign}{abs(offset)}".encode()


def _zone(name: bytes) -> dt.tzinfo | None:
    if not name:
        return None
    text = name.decode()
    if text == "UTC":
        return dt.timezone.utc
    if text.startswith(("UTC+", "UTC-")):
        h, m, s = (text[4:].split(":") + ["0", "0"])[:3]
        offset = dt.timedelta(hours=int(h), minutes=int(m), seconds=float(s))
        return dt.timezone(-offset if text[3] == "-" else offset)
    from zoneinfo import ZoneInfo

    return ZoneInfo(text)


# -- scalars of numpy, pandas and Arrow -> Python -----------------------------


def pythonic(value: Any) -> Any:
    """A numpy or Arrow scalar as its Python equivalent (a datetime64/timedelta64 with
    nanoseconds as the pandas type); anything else as it is."""
    if isinstance(value, np.generic):
        if isinstance(value, (np.datetime64, np.timedelta64)):
            if np.isnat(value):
                return None
            import pandas as pd

            if isinstance(value, np.datetime64):
                out = pd.Timestamp(value)
                return out if out.nanosecond else out.to_pydatetime()
            out = pd.Timedelta(value)
            return out if out.nanoseconds else out.to_pytimedelta()
        return value.item()
    if hasattr(value, "as_py") and type(value).__module__.startswith("pyarrow"):
        return value.as_py()
    return value


def _nanos(value: Any) -> int:
    return getattr(value, "nanosecond", 0) or getattr(value, "nanoseconds", 0)  # pandas Timestamp / Timedelta only


def micros_since_epoch(value: dt.datetime) -> int:
    """Microseconds since 1970 (UTC for an aware datetime, wall-clock for a naive one): Spark's timestamp."""
    if value.tzinfo is not None and value.utcoffset() is not None:
        return (value - EPOCH_UTC) // _US
    return (value.replace(tzinfo=None) - EPOCH) // _US


# -- encoding ----------------------------------------------------------------------


def _ext(code: int, data: bytes) -> msgpack.ExtType:
    """``msgpack.ExtType(code, data)`` without its constructor's checks of what is here always an int and bytes:
    they were a fifth of encoding a batch of values with a Decimal and a date each."""
    return _new_tuple(msgpack.ExtType, (code, data))


_new_tuple = tuple.__new__


def _date_ext(value: dt.date, packb: Callable[[Any], bytes]) -> msgpack.ExtType:
    return _ext(DATE, _I.pack((value - EPOCH_DATE).days))


def _datetime_ext(value: dt.datetime, packb: Callable[[Any], bytes]) -> msgpack.ExtType:
    return _ext(DATETIME, _QH.pack(micros_since_epoch(value), _nanos(value)) + _zone_name(value.tzinfo, value))


def _decimal_ext(value: Decimal, packb: Callable[[Any], bytes]) -> msgpack.ExtType:
    return _ext(DECIMAL, str(value).encode("ascii"))


def _uuid_ext(value: uuid.UUID, packb: Callable[[Any], bytes]) -> msgpack.ExtType:
    return _ext(UUID, value.bytes)


def _tuple_ext(value: tuple, packb: Callable[[Any], bytes]) -> msgpack.ExtType:
    return _ext(TUPLE, packb(list(value)))


# the types values mostly hold, by exact type: no look for a numpy or Arrow scalar first (a subclass, a pandas
# Timestamp among them, takes the long way)
_EXACT: dict[type, Callable[[Any, Callable[[Any], bytes]], msgpack.ExtType]] = {
    dt.date: _date_ext, dt.datetime: _datetime_ext, Decimal: _decimal_ext, uuid.UUID: _uuid_ext, tuple: _tuple_ext}


def to_ext(value: Any, packb: Callable[[Any], bytes]) -> msgpack.ExtType | Any:
    """The ext form of ``value``, or a plain msgpack form of it; raise TypeError if there is none.

    ``packb`` packs a tuple's items (with this same hook).
    """
    exact = _EXACT.get(type(value))
    if exact is not None:
        return exact(value, packb)
    value = pythonic(value)
    if isinstance(value, dt.datetime):  # before date: a datetime is a date
        if value != value:  # pandas NaT
            return None
        return _datetime_ext(value, packb)
    if isinstance(value, dt.date):
        return _date_ext(value, packb)
    if isinstance(value, dt.time):
        us = ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond
        return _ext(TIME, _Q.pack(us) + _zone_name(value.tzinfo, value))
    if isinstance(value, dt.timedelta):
        return _ext(TIMEDELTA, _QQH.pack(value.days, value.seconds * 1_000_000 + value.microseconds, _nanos(value)))
    if isinstance(value, Decimal):
        return _decimal_ext(value, packb)
    if isinstance(value, uuid.UUID):
        return _uuid_ext(value, packb)
    if isinstance(value, tuple):
        return _tuple_ext(value, packb)
    for cls in type(value).__mro__:
        if cls in _user_encoders:
            code, encode = _user_encoders[cls]
            return msgpack.ExtType(code, encode(value))
    if value is None:  # a NaT
        return None
    for base in (bool, int, float, str, bytes, list, dict):  # subclasses (IntEnum, OrderedDict, ...)
        if isinstance(value, base):
            return base(value)
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"can not serialize {type(value).__name__!r} object")


# -- decoding ----------------------------------------------------------------------


def _with_nanos(value: Any, nanos: int, cls_name: str) -> Any:
    if not nanos:
        return value
    import pandas as pd

    return getattr(pd, cls_name)(value) + pd.Timedelta(nanoseconds=nanos)


def from_ext(code: int, data: bytes, unpackb: Callable[[bytes], Any]) -> Any:
    if code == DATETIME:
        us, nanos = _QH.unpack_from(data)
        zone = _zone(data[_QH.size:])
        value = EPOCH + dt.timedelta(microseconds=us)
        if zone is not None:
            value = (EPOCH_UTC + dt.timedelta(microseconds=us)).astimezone(zone)
        return _with_nanos(value, nanos, "Timestamp")
    if code == DATE:
        return EPOCH_DATE + dt.timedelta(days=_I.unpack(data)[0])
    if code == TIME:
        s, us = divmod(_Q.unpack_from(data)[0], 1_000_000)
        return dt.time(s // 3600, s // 60 % 60, s % 60, us, tzinfo=_zone(data[_Q.size:]))
    if code == TIMEDELTA:
        days, us, nanos = _QQH.unpack(data)
        return _with_nanos(dt.timedelta(days=days, microseconds=us), nanos, "Timedelta")
    if code == DECIMAL:
        return Decimal(data.decode("ascii"))
    if code == UUID:
        return uuid.UUID(bytes=data)
    if code == TUPLE:
        return tuple(unpackb(data))
    decode = _user_decoders.get(code)
    if decode is None:
        return msgpack.ExtType(code, data)  # a user type whose codec this process has not registered
    return decode(data)
