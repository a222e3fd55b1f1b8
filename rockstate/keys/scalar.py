"""Spark's Murmur3 on one key at a time, in Python ints: the reference the column path is tested against."""

from __future__ import annotations

import datetime as dt
import struct
import uuid
from decimal import Decimal

import mmh3
import numpy as np

from ..codecs import EPOCH_DATE, micros_since_epoch, pythonic
from ..errors import ConfigError, InvalidKeyError

SEED = 42
_M32 = 0xFFFFFFFF
_C1, _C2 = 0xCC9E2D51, 0x1B873593
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_ALLOWED = ("None, bool, int (signed 64-bit), float, str, bytes/bytearray, datetime, date, time, timedelta,"
            " Decimal, UUID, or a non-empty tuple of those")
_US = dt.timedelta(microseconds=1)
_LONG_DIGITS = 18  # Spark's Decimal.MAX_LONG_DIGITS

# -- scalar Murmur3 on Python ints (all values kept in 0..2**32-1) -----------


def _mix(h: int, k: int) -> int:
    """Mix block k into running hash h (Murmur3's mixK1, then mixH1), inlined for speed."""
    k = (k * _C1) & _M32
    k = ((k << 15) | (k >> 17)) & _M32
    h ^= (k * _C2) & _M32
    h = ((h << 13) | (h >> 19)) & _M32
    return (h * 5 + 0xE6546B64) & _M32


def _fmix(h: int, length: int) -> int:
    h ^= length
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def _hash_long(v: int, h: int) -> int:
    h = _mix(h, v & _M32)
    h = _mix(h, (v >> 32) & _M32)
    return _fmix(h, 8)


def _hash_bytes(b: bytes, h: int) -> int:
    n = len(b)
    if not n & 3:  # no tail: standard Murmur3 (mmh3, in C) is Spark's hashUnsafeBytes
        return mmh3.hash(b, h, signed=False)
    aligned = n & ~3
    for k in struct.unpack_from(f"<{aligned >> 2}I", b):  # _mix inlined: a string key's hash is most of a one-key call's
        k = (k * _C1) & _M32
        k = ((k << 15) | (k >> 17)) & _M32
        h ^= (k * _C2) & _M32
        h = ((h << 13) | (h >> 19)) & _M32
        h = (h * 5 + 0xE6546B64) & _M32
    for byte in b[aligned:]:  # Spark mixes each tail byte as a signed byte
        h = _mix(h, (byte - 256 if byte > 127 else byte) & _M32)
    return _fmix(h, n)


def _double_bits(x: float) -> int:
    if x != x:
        return 0x7FF8000000000000  # Java's doubleToLongBits canonical NaN
    if x == 0.0:
        return 0  # Spark hashes -0.0 as 0.0
    return struct.unpack("<q", struct.pack("<d", x))[0]


def _bad_type(value) -> InvalidKeyError:
    return InvalidKeyError(
        f"unsupported key type {type(value).__name__!r}; a key is {_ALLOWED}", type=type(value).__name__
    )


def days_since_epoch(v: dt.date) -> int:
    return (v - EPOCH_DATE).days


def time_nanos(v: dt.time) -> int:
    return (((v.hour * 60 + v.minute) * 60 + v.second) * 1_000_000 + v.microsecond) * 1000


def interval_micros(v: dt.timedelta) -> int:
    return v // _US


def uuid_bytes(v: uuid.UUID) -> bytes:
    return str(v).encode()


def _decimal_hash(v: Decimal, h: int) -> int:
    if not v.is_finite():
        raise InvalidKeyError(f"Decimal key {v} is not finite (Spark's decimal has no NaN or Infinity)", type="Decimal")
    sign, digits, exponent = v.as_tuple()
    unscaled = int("".join(map(str, digits)) or "0") * 10 ** max(exponent, 0)
    unscaled = -unscaled if sign else unscaled
    if len(str(abs(unscaled))) <= _LONG_DIGITS:
        return _hash_long(unscaled, h)
    width = (unscaled if unscaled >= 0 else ~unscaled).bit_length() // 8 + 1  # Java's BigInteger.toByteArray
    return _hash_bytes(unscaled.to_bytes(width, "big", signed=True), h)


def _hash_column(v, h: int) -> int:
    """Hash one column value with running hash ``h``; raise for unsupported types."""
    if v is None:
        return h
    if isinstance(v, (np.generic, dt.datetime)) or type(v).__module__.startswith("pyarrow"):
        v = pythonic(v)
        if v is None or (isinstance(v, dt.datetime) and v != v):  # NaT
            return h
    if isinstance(v, (bool, np.bool_)):  # before int: bool is an int subclass
        return _fmix(_mix(h, int(v)), 4)
    if isinstance(v, (int, np.integer)):
        v = int(v)
        if not _INT64_MIN <= v <= _INT64_MAX:
            raise InvalidKeyError(
                f"int key {v} is outside the signed 64-bit range [{_INT64_MIN}, {_INT64_MAX}] of Spark's bigint",
                type="int",
            )
        return _hash_long(v, h)
    if isinstance(v, (float, np.floating)):
        return _hash_long(_double_bits(float(v)), h)
    if isinstance(v, str):
        return _hash_bytes(v.encode("utf-8"), h)
    if isinstance(v, (bytes, bytearray)):
        return _hash_bytes(bytes(v), h)
    if isinstance(v, dt.datetime):  # before date: a datetime is a date
        return _hash_long(micros_since_epoch(v), h)
    if isinstance(v, dt.date):
        return _fmix(_mix(h, days_since_epoch(v) & _M32), 4)
    if isinstance(v, dt.timedelta):
        return _hash_long(interval_micros(v), h)
    if isinstance(v, dt.time):
        return _hash_long(time_nanos(v), h)
    if isinstance(v, uuid.UUID):
        return _hash_bytes(uuid_bytes(v), h)
    if isinstance(v, Decimal):
        return _decimal_hash(v, h)
    raise _bad_type(v)


def _signed(h: int) -> int:
    return h - (1 << 32) if h & 0x80000000 else h


def _hash_key(key, h: int = SEED) -> int:
    """The unsigned hash of a whole key (a tuple: its columns in turn), from running hash ``h``."""
    if isinstance(key, tuple):
        if not key:
            raise InvalidKeyError(f"an empty tuple is not a key; a key is {_ALLOWED}", type="tuple")
        for col in key:
            if isinstance(col, tuple):  # _hash_column would name 'tuple' too, but say why
                raise InvalidKeyError(f"nested tuple in a key; a key is {_ALLOWED}", type="tuple")
            h = _hash_column(col, h)
        return h
    return _hash_column(key, h)


def spark_hash(key) -> int:
    """Spark SQL ``hash(cols...)`` of ``key`` as a signed 32-bit int."""
    if type(key) is int and _INT64_MIN <= key <= _INT64_MAX:  # fast paths for the commonest keys
        return _signed(_hash_long(key, SEED))
    if type(key) is str:
        if key.isascii() and not len(key) & 3:  # ids, UUIDs: no tail, mmh3 hashes the UTF-8 bytes as Spark does
            return mmh3.hash(key, SEED)
        return _signed(_hash_bytes(key.encode("utf-8"), SEED))
    return _signed(_hash_key(key))


def _check_partitions(partitions: int) -> None:
    if not isinstance(partitions, (int, np.integer)) or isinstance(partitions, bool) or partitions < 1:
        raise ConfigError(f"partition count must be a positive int, got {partitions!r}")


def partition_of(key, partitions: int) -> int:
    """Spark SQL ``pmod(hash(cols...), partitions)`` of ``key``."""
    _check_partitions(partitions)
    return spark_hash(key) % int(partitions)  # Python's % is pmod for a positive divisor


def check_key(key) -> None:
    """Raise InvalidKeyError if ``key`` is not a key rockstate can hash."""
    spark_hash(key)
