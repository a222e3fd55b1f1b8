"""Spark's Murmur3 on whole key columns with numpy: uint32 arrays, whose wrap-around is Java's int arithmetic."""

from __future__ import annotations

import datetime as dt
import uuid
from itertools import repeat

import mmh3
import numpy as np

from ..codecs import micros_since_epoch
from ..errors import InvalidInputError, InvalidKeyError
from .scalar import (_C1, _C2, _INT64_MAX, SEED, _check_partitions, _hash_column, _hash_key, days_since_epoch,
                     interval_micros, time_nanos, uuid_bytes)

try:
    import pyarrow as pa
except ImportError:  # pyarrow is only needed to hash Arrow input
    pa = None

_INT32_MAX = 2**31 - 1
_ALLOWED_COLUMNS = "integer, floating-point, boolean, string, binary, timestamp, date, duration or decimal values, and nulls"
_LE_WORD = np.dtype("<u4")

# -- vectorized Murmur3 on uint32 numpy arrays ---------------------------------
# Every function takes and returns uint32 arrays; multiplication wraps like Java.

_U_C1, _U_C2 = np.uint32(_C1), np.uint32(_C2)
_U_5, _U_N = np.uint32(5), np.uint32(0xE6546B64)
_U_F1, _U_F2 = np.uint32(0x85EBCA6B), np.uint32(0xC2B2AE35)


def _v_mix_k1(k: np.ndarray) -> np.ndarray:
    k = k * _U_C1
    high = k >> np.uint32(17)
    k <<= np.uint32(15)
    k |= high  # rotl(k, 15)
    k *= _U_C2
    return k


def _v_mix_h1(h: np.ndarray, k: np.ndarray) -> np.ndarray:
    h = h ^ k
    high = h >> np.uint32(19)
    h <<= np.uint32(13)
    h |= high  # rotl(h, 13)
    h *= _U_5
    h += _U_N
    return h


def _v_fmix(h: np.ndarray, length) -> np.ndarray:
    h = h ^ length
    h ^= h >> np.uint32(16)
    h *= _U_F1
    h ^= h >> np.uint32(13)
    h *= _U_F2
    h ^= h >> np.uint32(16)
    return h


def _v_hash_int(v: np.ndarray, h: np.ndarray) -> np.ndarray:
    return _v_fmix(_v_mix_h1(h, _v_mix_k1(v.astype(np.uint32))), np.uint32(4))


def _v_hash_long(v: np.ndarray, h: np.ndarray) -> np.ndarray:
    # low word, high word per value; mix_k1 runs on both at once (contiguous is faster)
    k = _v_mix_k1(np.ascontiguousarray(v, dtype="<i8").view(_LE_WORD))
    h = _v_mix_h1(h, k[0::2])
    h = _v_mix_h1(h, k[1::2])
    return _v_fmix(h, np.uint32(8))


def _v_hash_double(v: np.ndarray, h: np.ndarray) -> np.ndarray:
    v = np.asarray(v, dtype=np.float64)
    bits = v.view(np.int64).copy()
    bits[v == 0.0] = 0
    bits[np.isnan(v)] = 0x7FF8000000000000
    return _v_hash_long(bits, h)


def _v_hash_fixed(rows: np.ndarray, h: np.ndarray) -> np.ndarray:
    """hashUnsafeBytes of the rows of an (n, length) uint8 matrix (ids, UUIDs): one numpy step per block."""
    length = rows.shape[1]
    blocks = length >> 2
    k = _v_mix_k1(np.ascontiguousarray(rows[:, : blocks * 4]).view(_LE_WORD).T.copy())  # (blocks, n)
    for b in range(blocks):
        h = _v_mix_h1(h, k[b])
    for t in range(blocks * 4, length):  # Spark mixes each tail byte, sign-extended, as a block of its own
        h = _v_mix_h1(h, _v_mix_k1(rows[:, t].view(np.int8).astype(np.int32).view(np.uint32)))
    return _v_fmix(h, np.uint32(length))


def _v_hash_bytes(values: tuple[np.ndarray, np.ndarray, np.ndarray], h: np.ndarray) -> np.ndarray:
    """hashUnsafeBytes of every row's data[starts[i]:starts[i] + lengths[i]], seeded by h[i]."""
    starts, lengths, data = values
    n = len(lengths)
    if n and lengths[0] > 0 and (lengths == lengths[0]).all():  # one length: rows equally spaced are a matrix
        stride = int(starts[1] - starts[0]) if n > 1 else int(lengths[0])
        if stride >= lengths[0] and (n == 1 or (np.diff(starts) == stride).all()):
            rows = np.lib.stride_tricks.as_strided(data[int(starts[0]):], (n, int(lengths[0])), (stride, 1), writeable=False)
            return _v_hash_fixed(rows, h)
    blocks = lengths >> 2
    h = h.copy()
    most = int(blocks.max()) if len(blocks) else 0
    if most:
        # words[i] is the little-endian uint32 at byte i: an overlapping view, no copy.
        words = np.ndarray((len(data) - 3,), dtype=_LE_WORD, buffer=data, strides=(1,))
        # Rows sorted by block count, most first, so the rows that have a block b are a
        # prefix of length have[b]; one numpy step per block index, not per row.
        order = np.argsort((most - blocks).astype(np.uint16 if most < 2**16 else np.int64), kind="stable")
        have = np.cumsum(np.bincount(blocks, minlength=most + 1)[::-1])[::-1]
        hs, pos = h[order], starts[order]
        for b in range(1, most + 1):
            m = have[b]
            hs[:m] = _v_mix_h1(hs[:m], _v_mix_k1(words[pos[:m]]))
            pos[:m] += 4
        h[order] = hs
    tails = lengths & 3
    tail_starts = starts + (blocks << 2)
    signed = data.view(np.int8)
    for t in range(3):  # Spark mixes each tail byte, sign-extended, as a block of its own
        rows = np.flatnonzero(tails > t)
        if len(rows):
            k = signed[tail_starts[rows] + t].astype(np.int32).view(np.uint32)
            h[rows] = _v_mix_h1(h[rows], _v_mix_k1(k))
    return _v_fmix(h, lengths.astype(np.uint32))


_V_HASH = {"int": _v_hash_long, "double": _v_hash_double, "bool": _v_hash_int, "date": _v_hash_int, "bytes": _v_hash_bytes}


# -- columns -> (kind, values, valid) ------------------------------------------
# kind is a key of _V_HASH, "null" (every row null) or "rows" (a list hashed value
# by value). values cover every row (null rows hold filler); valid is a bool mask
# of the non-null rows, or None when there are no nulls.


def _pack(values: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts, lengths, data) of byte strings laid end to end."""
    lengths = np.fromiter(map(len, values), np.int64, len(values))
    starts = np.zeros(len(values), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    return starts, lengths, np.frombuffer(b"".join(values), dtype=np.uint8)


# msgpack str / bin header length by first byte (fixstr, str8/16/32, bin8/16/32); 0: not a str or bin
_HEADER = np.zeros(256, dtype=np.int64)
_HEADER[0xA0:0xC0] = 1
_HEADER[[0xD9, 0xDA, 0xDB, 0xC4, 0xC5, 0xC6]] = [2, 3, 5, 2, 3, 5]


def partitions_of_packed(packed: list[bytes], partitions: int, keys: list | None = None) -> np.ndarray:
    """``partitions_of`` of keys given by their msgpack encodings (rockstate's stored form), every one
    a str or bytes: hashed straight from the encodings, no decoding. ``keys``: the same keys as given
    (all str or all bytes), hashed in C when none has a tail (see ``_untailed_hashes``)."""
    _check_partitions(partitions)
    hashed = None if keys is None else _untailed_hashes(keys)
    if hashed is not None:
        return _pmod(hashed.view(np.uint32), partitions)
    starts, lengths, data = _pack(packed)
    header = _HEADER[data[starts]] if len(packed) else starts
    if not header.all():
        raise InvalidInputError("partitions_of_packed takes msgpack-encoded str or bytes keys only")
    h = _v_hash_bytes((starts + header, lengths - header, data), np.full(len(packed), SEED, dtype=np.uint32))
    return _pmod(h, partitions)


def _untailed_hashes(keys: list) -> np.ndarray | None:
    """Spark's hash (int32) of every key of a list of str (ASCII) or of bytes whose lengths are all multiples
    of 4 (UUIDs, most fixed-width ids), by mmh3: without tail bytes standard Murmur3 is Spark's
    hashUnsafeBytes. None for any other list."""
    kinds = set(map(type, keys))
    if kinds == {str}:
        if not "".join(keys).isascii():  # else a key's length in characters is not its UTF-8 length
            return None
    elif kinds != {bytes}:
        return None
    if any(n & 3 for n in set(map(len, keys))):
        return None
    return np.fromiter(map(mmh3.hash, keys, repeat(SEED)), np.int32, len(keys))


def _kind_of(t: type):
    """(kind, conversion of a value to what that kind hashes, or None), or None for no vectorized kind."""
    if issubclass(t, (bool, np.bool_)):
        return "bool", None
    if issubclass(t, (int, np.integer)):
        return "int", None
    if issubclass(t, (float, np.floating)):
        return "double", None
    if issubclass(t, str):  # string and binary hash alike: by their bytes
        return "bytes", str.encode
    if issubclass(t, (bytes, bytearray)):
        return "bytes", bytes
    if t.__name__ == "NaTType":  # a datetime that is not one
        return None
    if issubclass(t, dt.datetime):  # before date: a datetime is a date
        return "int", micros_since_epoch
    if issubclass(t, dt.date):
        return "date", days_since_epoch
    if issubclass(t, dt.timedelta):
        return "int", interval_micros
    if issubclass(t, dt.time):
        return "int", time_nanos
    if issubclass(t, uuid.UUID):
        return "bytes", uuid_bytes
    return None


_FILLER = {"int": 0, "double": 0.0, "bool": False, "bytes": b"", "date": 0}
_DTYPE = {"int": np.int64, "double": np.float64, "bool": bool, "date": np.int64}


def _from_objects(values: list):
    """Python objects: one kind (plus None) is vectorized, anything else goes row by row."""
    types = set(map(type, values))  # by type, not by value: far cheaper on long columns
    has_null = type(None) in types
    kinds = {_kind_of(t) for t in types - {type(None)}}
    if len(kinds) != 1 or None in kinds:
        return "rows", values, None
    kind, convert = kinds.pop()
    valid, filled = None, values
    if has_null:
        valid = np.array([v is not None for v in values], dtype=bool)
        filler = _FILLER[kind]
        filled = [filler if v is None else convert(v) if convert else v for v in values]
    elif convert is not None:
        filled = list(map(convert, values))
    if kind == "bytes":
        return kind, _pack(filled), valid
    try:
        return kind, np.array(filled, dtype=_DTYPE[kind]), valid
    except OverflowError:
        return "rows", values, None  # the row path raises, naming the out-of-range int


_UNIT_NANOS = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}


def _scaled(raw: np.ndarray, unit: str, to: str) -> np.ndarray:
    """int64 counts of ``unit`` as counts of ``to`` (floor division when finer)."""
    have, want = _UNIT_NANOS[unit], _UNIT_NANOS[to]
    return raw * (have // want) if have >= want else raw // (want // have)


def _from_arrow(arr):
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    if pa.types.is_null(t):
        return "null", None, None
    valid = arr.is_valid().to_numpy(zero_copy_only=False) if arr.null_count else None
    if pa.types.is_integer(t):
        try:
            arr = arr.cast(pa.int64())
        except pa.ArrowInvalid:
            raise InvalidKeyError(f"{t} column holds values beyond Spark's bigint (signed 64-bit)", type=str(t)) from None
        return "int", arr.fill_null(0).to_numpy(), valid
    if pa.types.is_floating(t):
        return "double", arr.cast(pa.float64()).fill_null(0.0).to_numpy(), valid
    if pa.types.is_boolean(t):
        return "bool", arr.fill_null(False).to_numpy(zero_copy_only=False), valid
    if pa.types.is_date(t):
        return "date", arr.cast(pa.date32()).cast(pa.int32()).fill_null(0).to_numpy().astype(np.int64), valid
    if pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_time(t):
        raw = arr.cast(pa.int64()).fill_null(0).to_numpy()
        return "int", _scaled(raw, t.unit, "ns" if pa.types.is_time(t) else "us"), valid
    if pa.types.is_decimal(t):
        return _from_objects(arr.to_pylist())
    if pa.types.is_string(t) or pa.types.is_binary(t):
        offset_type = np.int32
    elif pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        offset_type = np.int64
    else:
        raise InvalidKeyError(f"unsupported key column type {str(t)!r}; a key column holds {_ALLOWED_COLUMNS}", type=str(t))
    _, offset_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(offset_buf, dtype=offset_type)[arr.offset : arr.offset + len(arr) + 1].astype(np.int64)
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return "bytes", (offsets[:-1], np.diff(offsets), data), valid


def _column(col):
    if pa is not None and isinstance(col, (pa.Array, pa.ChunkedArray)):
        return _from_arrow(col)
    if not isinstance(col, (list, tuple)):
        col = np.asarray(col)  # numpy arrays, pandas Series, ...
    if isinstance(col, np.ndarray):
        kind = col.dtype.kind
        if col.ndim != 1:
            raise InvalidKeyError(f"a key column must be one-dimensional, got shape {col.shape}", type="ndarray")
        if kind == "u" and len(col) and col.max() > _INT64_MAX:
            raise InvalidKeyError(f"{col.dtype} column holds values beyond Spark's bigint (signed 64-bit)", type=str(col.dtype))
        if kind in "iu":
            return "int", col.astype(np.int64, copy=False), None
        if kind in "fb":
            return {"f": "double", "b": "bool"}[kind], col, None
        if kind in "US":  # numpy str / bytes arrays
            return "bytes", _pack(list(map(str.encode, col.tolist())) if kind == "U" else col.tolist()), None
        if kind in "mM":  # datetime64 (timestamp_ntz), timedelta64
            unit = np.datetime_data(col.dtype)[0]
            if unit not in _UNIT_NANOS:  # days, weeks, ...: exact in microseconds
                col, unit = col.astype(col.dtype.str[:-3] + "[us]"), "us"
            nat = np.isnat(col)
            raw = np.where(nat, 0, col.view(np.int64))
            return "int", _scaled(raw, unit, "us"), ~nat if nat.any() else None
        if kind != "O":
            raise InvalidKeyError(f"unsupported key column dtype {col.dtype}; a key column holds {_ALLOWED_COLUMNS}", type=str(col.dtype))
        col = col.tolist()
    return _from_objects(list(col))


def _is_column(x) -> bool:
    if pa is not None and isinstance(x, (pa.Array, pa.ChunkedArray)):
        return True
    return isinstance(x, (list, np.ndarray)) or (hasattr(x, "__array__") and not isinstance(x, np.generic))


def partitions_of(columns, partitions: int) -> np.ndarray:
    """``pmod(hash(col0, col1, ...), partitions)`` per row, as an int32 array (int64 if P > 2**31-1).

    ``columns`` is one column or a list/tuple of columns of equal length; a column
    is a numpy array, a pyarrow Array/ChunkedArray, a pandas Series or a Python
    list (so a list of scalars is one column). Nulls (Arrow nulls, None) are
    skipped per row, as Spark does; a column of mixed Python types is hashed row
    by row.
    """
    if isinstance(columns, (list, tuple)) and columns and all(_is_column(c) for c in columns):
        return partitions_of_columns(columns, partitions)
    return partitions_of_columns([columns], partitions)


def partitions_of_columns(cols, partitions: int) -> np.ndarray:
    """``partitions_of`` of a list of columns, each a list, tuple, numpy array, pandas Series or Arrow array."""
    _check_partitions(partitions)
    lengths = {len(c) for c in cols}
    if len(lengths) != 1:
        raise InvalidInputError(f"key columns have different lengths: {sorted(lengths)}")
    h = np.full(lengths.pop(), SEED, dtype=np.uint32)
    for col in cols:
        kind, values, valid = _column(col)
        if kind == "rows":  # one column may hold whole keys, tuples included
            hash_one = _hash_key if len(cols) == 1 else _hash_column
            h = np.array([hash_one(v, s) for v, s in zip(values, h.tolist())], dtype=np.uint32)
        elif kind != "null":
            hashed = _V_HASH[kind](values, h)
            h = hashed if valid is None else np.where(valid, hashed, h)
    return _pmod(h, partitions)


def _pmod(h: np.ndarray, partitions: int) -> np.ndarray:
    signed = h.view(np.int32)
    if partitions <= _INT32_MAX:  # int32 arithmetic is faster; Python's % semantics are pmod
        return np.remainder(signed, np.int32(partitions))
    return signed.astype(np.int64) % int(partitions)
