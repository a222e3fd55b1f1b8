"""Key and value encoding: msgpack, type-checked, size-limited.

Keys are scalars (None, bool, int, float, str, bytes) or tuples of scalars;
their msgpack encoding is self-delimiting, so ``encode_key(k) + suffix``
never collides with another key's encoding: map-state entries and prefix
scans rely on that. Values are None, bool, int, float, str, bytes, list and
dict (tuples come back as lists). No pickle.
"""

from __future__ import annotations

from typing import Any, Iterable

import msgpack

from .errors import InvalidKeyError, InvalidValueError, SizeLimitError

DEFAULT_MAX_BYTES = 16 * 1024 * 1024
KEY_TYPES = "None, bool, int (64-bit), float, str, bytes, or a tuple of those"
VALUE_TYPES = "None, bool, int (64-bit), float, str, bytes, list, dict"

_SCALARS = frozenset({type(None), bool, int, float, str, bytes})
_INT64 = (-(1 << 63), (1 << 63) - 1)

_pack = msgpack.Packer(use_bin_type=True).pack


def _bad_key(key: Any) -> InvalidKeyError:
    if isinstance(key, int) and not isinstance(key, bool):
        return InvalidKeyError(f"int key {key} is outside the signed 64-bit range (Spark bigint)")
    return InvalidKeyError(f"unsupported key type {type(key).__name__}; keys are {KEY_TYPES}")


def _check_key(key: Any) -> None:
    kind = type(key)
    if kind is int:
        if not _INT64[0] <= key <= _INT64[1]:
            raise _bad_key(key)
    elif kind is tuple:
        for part in key:
            if type(part) is tuple or type(part) not in _SCALARS:
                raise _bad_key(part)
            _check_key(part)
    elif kind not in _SCALARS:
        raise _bad_key(key)


def encode_key(key: Any, limit: int = DEFAULT_MAX_BYTES) -> bytes:
    _check_key(key)
    data = _pack(key)
    if len(data) > limit:
        raise SizeLimitError(f"key of {len(data)} bytes is over the limit of {limit} bytes", limit=limit)
    return data


def encode_keys(keys: Iterable[Any], limit: int = DEFAULT_MAX_BYTES) -> list[bytes]:
    """Encode many keys; the first bad one raises before anything is written."""
    out = []
    for key in keys:
        if type(key) is int and _INT64[0] <= key <= _INT64[1]:  # the hot path
            out.append(_pack(key))
        else:
            out.append(encode_key(key, limit))
    return out


def decode_key(data: bytes) -> Any:
    return msgpack.unpackb(data, use_list=False, raw=False)


def encode_value(value: Any, limit: int = DEFAULT_MAX_BYTES) -> bytes:
    try:
        data = _pack(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidValueError(
            f"cannot encode value of type {type(value).__name__} ({exc}); values are {VALUE_TYPES}"
        ) from None
    if len(data) > limit:
        raise SizeLimitError(f"value of {len(data)} bytes is over the limit of {limit} bytes", limit=limit)
    return data


def encode_values(values: Iterable[Any], limit: int = DEFAULT_MAX_BYTES) -> list[bytes]:
    pack = _pack
    try:
        out = list(map(pack, values))
    except (TypeError, ValueError, OverflowError):
        out = [encode_value(v, limit) for v in values]  # find and name the bad one
    for data in out:
        if len(data) > limit:
            raise SizeLimitError(f"value of {len(data)} bytes is over the limit of {limit} bytes", limit=limit)
    return out


def decode_value(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def decode_stream(data: bytes) -> list[Any]:
    """Decode concatenated values (a list state's stored form)."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(data)
    return list(unpacker)


def split_pair(data: bytes) -> tuple[Any, Any]:
    """Decode ``encode_key(k) + encode_key(uk)`` (a map-state entry's key) into (k, uk)."""
    unpacker = msgpack.Unpacker(use_list=False, raw=False)
    unpacker.feed(data)
    return next(unpacker), next(unpacker)
