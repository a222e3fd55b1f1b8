"""Arrow columns encoded as stored values column-wise: the bytes ``encode_values`` gives their Python values.

Turning an Arrow column into Python objects and packing each costs ~17 µs a
row for a struct of a decimal and a timestamp (``to_pylist`` builds
``Decimal``s and zone-aware datetimes; each goes through msgpack's Python
hook); this builds the same msgpack bytes with Arrow and numpy kernels.
Covered: null, booleans, integers, floats, strings, binary, dates,
timestamps (s, ms, us), decimals and structs of these; anything else
answers None and the caller takes the Python path. ``tests/spark/
test_arrow_values.py`` checks the bytes equal the Python path's, type by type.
"""

from __future__ import annotations

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..codecs import DATE, DATETIME, DECIMAL, _zone_name

_FIXEXT = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}
_TO_US = {"s": 1_000_000, "ms": 1_000, "us": 1}


def encode_column(column: pa.Array) -> list[bytes | None] | None:
    """Each row's stored value (None for a null row), or None if the column's type is not covered."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    encoded = _encode(column)
    return None if encoded is None else encoded.to_numpy(zero_copy_only=False).tolist()


def _encode(arr: pa.Array) -> pa.Array | None:
    t = arr.type
    if pa.types.is_null(t):
        return pa.nulls(len(arr), pa.binary())
    if pa.types.is_boolean(t):
        return pc.if_else(arr, pa.scalar(b"\xc3"), pa.scalar(b"\xc2"))
    if pa.types.is_integer(t):
        return _ints(arr)
    if pa.types.is_floating(t) and not pa.types.is_float16(t):
        rows = np.empty((len(arr), 9), np.uint8)
        rows[:, 0] = 0xCB
        rows[:, 1:] = arr.cast(pa.float64()).fill_null(0).to_numpy().astype(">f8").view(np.uint8).reshape(-1, 8)
        return _binary(rows, np.full(len(arr), 9), arr)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return _with_length(arr, (0xA0, 32), (0xD9, 0xDA, 0xDB))
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return _with_length(arr, None, (0xC4, 0xC5, 0xC6))
    if pa.types.is_date32(t):
        days = arr.cast(pa.int32()).fill_null(0).to_numpy().astype(">i4").view(np.uint8).reshape(-1, 4)
        return _ext(DATE, _binary(days, np.full(len(arr), 4), arr))
    if pa.types.is_timestamp(t) and t.unit in _TO_US:
        return _timestamps(arr)
    if pa.types.is_decimal(t):
        text = arr.cast(pa.string())
        if pc.any(pc.match_substring(text, ".E")).as_py():  # pyarrow < 16 writes a zero of scale > 6 as "0.E-10"
            return None
        return _ext(DECIMAL, text.cast(pa.binary()))
    if pa.types.is_struct(t):
        return _struct(arr)
    return None


def _ints(arr: pa.Array) -> pa.Array | None:
    """msgpack's smallest form of each int, as the Packer picks it."""
    if pa.types.is_uint64(arr.type) and (pc.max(arr).as_py() or 0) >= 1 << 63:
        return None
    v = arr.cast(pa.int64()).fill_null(0).to_numpy()
    n = len(v)
    be = v.astype(">i8").view(np.uint8).reshape(-1, 8)
    # (lower bound, upper bound, marker byte or None, payload bytes); positives as unsigned, negatives as signed
    forms = [(0, 127, None, 1), (128, 255, 0xCC, 1), (256, 65535, 0xCD, 2), (65536, 2**32 - 1, 0xCE, 4),
             (2**32, 2**63 - 1, 0xCF, 8), (-32, -1, None, 1), (-128, -33, 0xD0, 1), (-32768, -129, 0xD1, 2),
             (-(2**31), -32769, 0xD2, 4), (-(2**63), -(2**31) - 1, 0xD3, 8)]
    rows = np.zeros((n, 9), np.uint8)
    lengths = np.zeros(n, np.int64)
    for low, high, marker, size in forms:
        hit = (v >= low) & (v <= high)
        if not hit.any():
            continue
        if marker is None:
            rows[hit, 0] = be[hit, 7]
            lengths[hit] = 1
        else:
            rows[hit, 0] = marker
            rows[hit, 1:1 + size] = be[hit, 8 - size:]
            lengths[hit] = 1 + size
    return _binary(rows, lengths, arr)


def _binary(rows: np.ndarray, lengths: np.ndarray, like: pa.Array) -> pa.Array:
    """A binary array of each row's first ``lengths[i]`` bytes, null where ``like`` is."""
    data = rows[np.arange(rows.shape[1]) < lengths[:, None]]  # row by row, each row's used bytes
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    out = pa.Array.from_buffers(pa.binary(), len(lengths), [None, pa.py_buffer(offsets), pa.py_buffer(data.tobytes())])
    return out if not like.null_count else pc.if_else(like.is_valid(), out, pa.scalar(None, pa.binary()))


def _with_length(arr: pa.Array, fix: tuple[int, int] | None, markers: tuple[int, int, int]) -> pa.Array:
    """A str or bin header by length (fixstr below 32, else 8-, 16- or 32-bit lengths), then the bytes."""
    data = arr.cast(pa.large_binary()).cast(pa.binary()) if pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type) else arr.cast(pa.binary())
    n = pc.binary_length(data).fill_null(0).to_numpy().astype(np.int64)
    rows = np.zeros((len(n), 5), np.uint8)
    lengths = np.zeros(len(n), np.int64)
    be = n.astype(">u4").view(np.uint8).reshape(-1, 4)
    small = np.zeros(len(n), bool) if fix is None else n < fix[1]
    if fix is not None:
        rows[small, 0] = fix[0] | n[small]
        lengths[small] = 1
    for marker, size, high in zip(markers, (1, 2, 4), (255, 65535, 2**32 - 1)):
        hit = ~small & (lengths == 0) & (n <= high)
        rows[hit, 0] = marker
        rows[hit, 1:1 + size] = be[hit, 4 - size:]
        lengths[hit] = 1 + size
    return pc.binary_join_element_wise(_binary(rows, lengths, arr), data, pa.scalar(b""))


def _ext(code: int, payload: pa.Array) -> pa.Array:
    """msgpack ext ``code`` around each payload: fixext for 1, 2, 4, 8 and 16 bytes, else ext 8/16/32."""
    n = pc.binary_length(payload).fill_null(0).to_numpy().astype(np.int64)
    rows = np.zeros((len(n), 6), np.uint8)
    lengths = np.zeros(len(n), np.int64)
    for size, marker in _FIXEXT.items():
        hit = n == size
        rows[hit, 0], rows[hit, 1], lengths[hit] = marker, code, 2
    be = n.astype(">u4").view(np.uint8).reshape(-1, 4)
    for marker, size, high in ((0xC7, 1, 255), (0xC8, 2, 65535), (0xC9, 4, 2**32 - 1)):
        hit = (lengths == 0) & (n <= high)
        rows[hit, 0] = marker
        rows[hit, 1:1 + size] = be[hit, 4 - size:]
        rows[hit, 1 + size] = code
        lengths[hit] = 2 + size
    return pc.binary_join_element_wise(_binary(rows, lengths, payload), payload, pa.scalar(b""))


def _timestamps(arr: pa.Array) -> pa.Array:
    """ext DATETIME: ``>qH`` microseconds since 1970 (UTC, or wall clock without a zone), no nanoseconds, the zone."""
    t = arr.type
    zone = b""
    if t.tz is not None:
        first = next((v for v in arr if v.is_valid), None)
        if first is not None:
            value = first.as_py()
            zone = _zone_name(value.tzinfo, value)
    micros = arr.cast(pa.int64()).fill_null(0).to_numpy() * _TO_US[t.unit]
    rows = np.zeros((len(arr), 10), np.uint8)
    rows[:, :8] = micros.astype(">i8").view(np.uint8).reshape(-1, 8)
    payload = _binary(rows, np.full(len(arr), 10), arr)
    if zone:
        payload = pc.binary_join_element_wise(payload, pa.scalar(zone), pa.scalar(b""))
    return _ext(DATETIME, payload)


def _struct(arr: pa.Array) -> pa.Array | None:
    """A map of its fields, in their order (a dict from ``to_pylist``), null fields as nil."""
    t = arr.type
    names = [t.field(i).name for i in range(t.num_fields)]
    if len(set(names)) != len(names) or len(names) > 15:
        return None
    parts: list[pa.Array | pa.Scalar] = [pa.scalar(bytes([0x80 | len(names)]))]
    for name, field in zip(names, arr.flatten()):  # each child sliced as the struct is
        encoded = _encode(field)
        if encoded is None:
            return None
        parts += [pa.scalar(msgpack.packb(name, use_bin_type=True)), encoded.fill_null(b"\xc0")]
    joined = pc.binary_join_element_wise(*parts, pa.scalar(b""))
    if isinstance(joined, pa.Scalar):  # no field: every row is the empty map
        joined = pa.array([joined.as_py()] * len(arr), pa.binary())
    return joined if not arr.null_count else pc.if_else(arr.is_valid(), joined, pa.scalar(None, pa.binary()))
