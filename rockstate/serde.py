"""Key and value encoding: msgpack, type-checked, size-limited.

Keys are scalars (None, bool, int, float, str, bytes, datetime, date, time,
timedelta, Decimal, UUID) or tuples of scalars; their msgpack encoding is
self-delimiting, so ``encode_key(k) + suffix`` never collides with another
key's encoding: map-state entries and prefix scans rely on that. An aware
datetime key is stored in UTC (keys are equal when their instants are).
Values are those scalars, tuples, lists and dicts, and users' types with a
registered codec (``codecs.register_codec``). The types beyond msgpack's own
are msgpack ext types (``codecs``), so data written before they existed
decodes as before (a tuple written then comes back as a list). numpy, pandas
and Arrow scalars count as their Python equivalents. No pickle.
"""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from functools import partial
from typing import Any, Iterable, Sequence

import msgpack

from . import codecs
from .errors import InvalidKeyError, InvalidValueError, SizeLimitError

DEFAULT_MAX_BYTES = 16 * 1024 * 1024
KEY_TYPES = "None, bool, int (64-bit), float, str, bytes, datetime, date, time, timedelta, Decimal, UUID, or a tuple of those"
VALUE_TYPES = "None, bool, int (64-bit), float, str, bytes, datetime, date, time, timedelta, Decimal, UUID, tuple, list, dict"

_SCALARS = frozenset({type(None), bool, int, float, str, bytes})
_EXT_KEYS = (dt.date, dt.time, dt.timedelta, Decimal, uuid.UUID)  # dt.datetime is a dt.date
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _key_ext(value: Any) -> Any:
    if isinstance(value, dt.datetime) and value.tzinfo is not None and value.utcoffset() is not None:
        value = value.astimezone(dt.timezone.utc)
    return codecs.to_ext(value, _pack)


def _value_ext(value: Any) -> Any:
    return codecs.to_ext(value, _pack_value_inner)


# Keys: tuples are msgpack arrays (as they always were). Values: exact types, so a tuple or a
# subclass of a native type reaches the hook (tuples get an ext type of their own).
_pack = msgpack.Packer(use_bin_type=True, default=_key_ext).pack
_pack_value = msgpack.Packer(use_bin_type=True, default=_value_ext, strict_types=True).pack
# a tuple's items: a Packer is not re-entrant, so a fresh one per nested tuple
_pack_value_inner = partial(msgpack.packb, use_bin_type=True, default=_value_ext, strict_types=True)


def _ext_hook(code: int, data: bytes) -> Any:
    return codecs.from_ext(code, data, decode_value)


def _key_ext_hook(code: int, data: bytes) -> Any:
    return codecs.from_ext(code, data, decode_key)


def _bad_key(key: Any) -> InvalidKeyError:
    if isinstance(key, int) and not isinstance(key, bool):
        return InvalidKeyError(f"int key {key} is outside the signed 64-bit range (Spark bigint)")
    return InvalidKeyError(f"unsupported key type {type(key).__name__}; keys are {KEY_TYPES}", type=type(key).__name__)


def _check_scalar(key: Any) -> Any:
    """The key as a plain scalar (numpy/Arrow ones converted); raise if it is none."""
    kind = type(key)
    if kind in _SCALARS:
        if kind is int and not _INT64[0] <= key <= _INT64[1]:
            raise _bad_key(key)
        return key
    plain = codecs.pythonic(key)
    if plain is not key:
        return _check_scalar(plain)
    for base in (int, float, str, bytes, bytearray):  # subclasses: np.float64, np.str_, IntEnum, ...
        if isinstance(key, base):
            return _check_scalar(bytes(key) if base is bytearray else base(key))
    if isinstance(key, _EXT_KEYS):
        if isinstance(key, Decimal) and not key.is_finite():
            raise InvalidKeyError(f"Decimal key {key} is not finite (Spark's decimal has no NaN or Infinity)", type="Decimal")
        return key
    raise _bad_key(key)


def check_key(key: Any) -> Any:
    """The key with numpy/Arrow scalars as Python ones; raise InvalidKeyError if it is not a key."""
    if type(key) is tuple:
        if not key:
            raise InvalidKeyError(f"an empty tuple is not a key; keys are {KEY_TYPES}", type="tuple")
        if any(type(part) is tuple for part in key):
            raise InvalidKeyError(f"nested tuple in a key; keys are {KEY_TYPES}", type="tuple")
        return tuple(map(_check_scalar, key))
    return _check_scalar(key)


def _limit(data: bytes, limit: int, what: str) -> bytes:
    if len(data) > limit:
        raise SizeLimitError(f"{what} of {len(data)} bytes is over the limit of {limit} bytes", limit=limit)
    return data


def encode_key(key: Any, limit: int = DEFAULT_MAX_BYTES) -> bytes:
    return _limit(_pack(check_key(key)), limit, "key")


_PLAIN = frozenset({str, bytes, float, bool, type(None)})


def _plain(column: Sequence[Any]) -> bool:
    """Whether msgpack packs every key of the column as it is: plain scalars, ints within 64 bits."""
    types = set(map(type, column))
    if int in types:
        ints = column if len(types) == 1 else [k for k in column if type(k) is int]
        if min(ints) < _INT64[0] or max(ints) > _INT64[1]:
            return False
    return types - {int} <= _PLAIN


def _plain_keys(keys: Sequence[Any], columns: Sequence[Sequence[Any]] | None) -> bool:
    if columns is None and keys and type(keys[0]) is tuple:  # tuples: column by column
        if set(map(type, keys)) != {tuple} or len(set(map(len, keys))) != 1 or not keys[0]:
            return False
        columns = list(zip(*keys))
    return _plain(keys) if columns is None else all(map(_plain, columns))


def encode_keys(keys: Sequence[Any], limit: int = DEFAULT_MAX_BYTES, columns: Sequence[Sequence[Any]] | None = None) -> list[bytes]:
    """Encode many keys; the first bad one raises, naming its index, before anything is written.

    ``columns``: when the keys are tuples of one length (not empty), their columns, if already made."""
    if _plain_keys(keys, columns):
        out = list(map(_pack, keys))  # the hot path: one C loop
        if max(map(len, out), default=0) <= limit:
            return out
    out = []
    for i, key in enumerate(keys):
        try:
            out.append(encode_key(key, limit))
        except (InvalidKeyError, SizeLimitError) as e:
            raise type(e)(f"key at index {i}: {e.message}", index=i, **e.data) from None
    return out


def decode_key(data: bytes) -> Any:
    return msgpack.unpackb(data, use_list=False, raw=False, ext_hook=_key_ext_hook)


def encode_value(value: Any, limit: int = DEFAULT_MAX_BYTES) -> bytes:
    try:
        data = _pack_value(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidValueError(
            f"cannot encode value of type {type(value).__name__} ({exc}); values are {VALUE_TYPES},"
            " or a type registered with rockstate.register_codec", type=type(value).__name__
        ) from None
    return _limit(data, limit, "value")


def encode_values(values: Iterable[Any], limit: int = DEFAULT_MAX_BYTES, keys: Sequence[Any] | None = None) -> list[bytes]:
    """Encode many values; a bad one raises naming its index (and its key, given ``keys``)."""
    values = values if isinstance(values, list) else list(values)
    try:
        out = list(map(_pack_value, values))
        if max(map(len, out), default=0) <= limit:
            return out
    except (TypeError, ValueError, OverflowError):
        pass
    for i, value in enumerate(values):  # find and name the bad one
        try:
            encode_value(value, limit)
        except (InvalidValueError, SizeLimitError) as e:
            which = f"value at index {i}" if keys is None else f"value of key {keys[i]!r} (index {i})"
            raise type(e)(f"{which}: {e.message}", index=i, **e.data) from None
    raise AssertionError("unreachable: some value failed to encode")


def decode_value(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=_ext_hook)


def decode_values(values: list[bytes | None], default: Any = None) -> list[Any]:
    """Decode stored values, ``default`` for None: the present ones as one stream (no unpacking call per value)."""
    if None not in values:
        return decode_stream(b"".join(values))
    found = iter(decode_stream(b"".join(v for v in values if v is not None)))
    return [default if v is None else next(found) for v in values]


def decode_stream(data: bytes) -> list[Any]:
    """Decode concatenated values (a list state's stored form)."""
    # the buffer fits the data: msgpack's default (100 MiB) refused a larger page of values
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, ext_hook=_ext_hook, max_buffer_size=max(len(data), 1))
    unpacker.feed(data)
    return list(unpacker)


def split_pair(data: bytes) -> tuple[Any, Any]:
    """Decode ``encode_key(k) + encode_key(uk)`` (a map-state entry's key) into (k, uk)."""
    unpacker = msgpack.Unpacker(use_list=False, raw=False, ext_hook=_key_ext_hook)
    unpacker.feed(data)
    return next(unpacker), next(unpacker)
