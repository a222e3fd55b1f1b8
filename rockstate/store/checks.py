"""Checks of write ops received over the wire, before any of them is applied: shape, codes, states, sizes."""

from __future__ import annotations

from itertools import chain

import msgpack

from ..errors import ProtocolError, SizeLimitError
from ..ops import APPEND, DELETE, DELETE_MANY, DELETE_PREFIX, DELETE_RANGE, PUT, PUT_MANY, RAW_PUT
from .catalog import RESERVED_PREFIX, StateSpec, unknown_state

EXPIRY_BYTES = 8  # the header of a value of a state with a TTL: its expiry, ms since the epoch
_CODES = "0 PUT, 1 DELETE, 2 APPEND, 3 DELETE_PREFIX, 4 PUT_MANY, 5 DELETE_MANY, 6 RAW_PUT, 7 DELETE_RANGE"
_ONE_KEY = {PUT: True, APPEND: True, RAW_PUT: True, DELETE_RANGE: True, DELETE: False, DELETE_PREFIX: False}  # -> takes a value
_STORES = frozenset((PUT, APPEND, RAW_PUT))  # single-key ops that store their key and value (size-limited)


def check_ops(ops: object, specs: dict[str, StateSpec], where: str,
              max_key: int | None = None, max_value: int | None = None) -> None:
    """Check write ops received over the wire before any of them is applied: shape, op codes, states and sizes.

    With ``max_key`` and ``max_value`` (the cluster's ``max_key_bytes`` and
    ``max_value_bytes``), what an op stores is held to the limits the client
    holds encoded keys and values to (see ``check_size``), so a peer that
    bypasses the client gets the same ``SizeLimitError``. The items of
    PUT_MANY / DELETE_MANY lists are only measured here, with ``len`` in a C
    loop (looking at each in Python would cost on the hot path): one that is
    not bytes fails its group as it is applied.
    """
    if type(ops) is not list:
        raise ProtocolError(f"ops of {where} must be a list of [code, state, key, value], not {type(ops).__name__}")
    sized = max_key is not None
    for i, op in enumerate(ops):
        if type(op) not in (list, tuple) or len(op) != 4:
            raise ProtocolError(f"op {i} of {where} is {op!r:.100}; an op is [code, state, key, value]")
        code, state, key, value = op
        if type(state) is not str:
            raise ProtocolError(f"state of op {i} of {where} must be a str, not {type(state).__name__}")
        spec = specs.get(state)
        if spec is None and not state.startswith(RESERVED_PREFIX):
            raise unknown_state(state, specs)
        if code in (PUT_MANY, DELETE_MANY):
            if type(key) is not list:
                raise ProtocolError(f"key of op {i} of {where} (PUT_MANY/DELETE_MANY) must be a list of bytes, not {type(key).__name__}")
            if code == PUT_MANY:
                if type(value) is not list or len(value) != len(key):
                    got = f"{len(value)} values" if type(value) is list else f"a {type(value).__name__}"
                    raise ProtocolError(f"op {i} of {where} (PUT_MANY) has {len(key)} keys and {got}; it needs a list of values as long")
                if sized and spec is not None and key:
                    try:  # the hot path: two C loops, no Python per item
                        over = len(max(key, key=len)) > max_key or len(max(value, key=len)) > max_value  # type: ignore[operator]  # sized: the caller gives both limits
                    except TypeError:  # an item without a length
                        bad = next(x for x in (*key, *value) if not hasattr(x, "__len__"))
                        raise ProtocolError(f"op {i} of {where} (PUT_MANY) holds a {type(bad).__name__}; keys and values are bytes") from None
                    if over:  # find and name the first too long (a map's keys and a list's values may be longer)
                        for k, v in zip(key, value):
                            if type(k) is bytes and type(v) is bytes and (len(k) > max_key or len(v) > max_value):  # type: ignore[operator]  # others fail as applied; sized: both limits given
                                check_size(spec, PUT, k, v, f"op {i} of {where}", max_key, max_value)  # type: ignore[arg-type]  # sized: the caller gives both limits
        elif type(code) is int and code in _ONE_KEY:
            if type(key) is not bytes:
                raise ProtocolError(f"key of op {i} of {where} must be bytes, not {type(key).__name__}")
            if _ONE_KEY[code] and type(value) is not bytes:
                raise ProtocolError(f"value of op {i} of {where} must be bytes, not {type(value).__name__}")
            if sized and spec is not None and code in _STORES and (len(key) > max_key or len(value) > max_value):  # type: ignore[operator]  # sized: the caller gives both limits
                check_size(spec, code, key, value, f"op {i} of {where}", max_key, max_value)  # type: ignore[arg-type]  # sized: both limits given; over, unless allowed more
        else:
            raise ProtocolError(f"unknown op code {code!r} in op {i} of {where}; codes are {_CODES}")


def check_put_pieces(groups: list, specs: dict[str, StateSpec], max_key: int | None, max_value: int | None) -> bool:
    """``check_ops`` of every group of a request at once, when each is one PUT_MANY of one user state (a batch put's
    pieces: at P=1024 ~340 a node, each its call and its two ``max`` calls, 3 % of a node's puts): True when they
    pass. False for any other shape, or anything wrong: the caller checks them group by group, which names it."""
    state: object = _UNSET
    for _, ops in groups:
        if type(ops) is not list or len(ops) != 1:
            return False
        op = ops[0]
        if type(op) not in (list, tuple) or len(op) != 4 or op[0] != PUT_MANY or type(op[2]) is not list \
                or type(op[3]) is not list or len(op[2]) != len(op[3]):
            return False
        if op[1] != state:
            if state is not _UNSET:
                return False
            state = op[1]
    if type(state) is not str or state not in specs:
        return False
    if max_key is None or max_value is None:
        return True
    try:  # C loops over every key and every value of the request
        return (max(map(len, chain.from_iterable(ops[0][2] for _, ops in groups)), default=0) <= max_key
                and max(map(len, chain.from_iterable(ops[0][3] for _, ops in groups)), default=0) <= max_value)
    except TypeError:  # an item without a length
        return False


_UNSET = object()


def check_compare_and_set(cas: object, specs: dict[str, StateSpec], pid: int, max_key: int, max_value: int) -> None:
    """A compare-and-set received over the wire: [state, key, expected or None, new], and the size limits."""
    if type(cas) is not list or len(cas) != 4 or type(cas[0]) is not str or type(cas[1]) is not bytes \
            or type(cas[2]) not in (bytes, type(None)) or type(cas[3]) is not bytes:
        raise ProtocolError(f"a compare-and-set of partition {pid} is [state, key, expected or None, new] "
                            f"(bytes but the state), not {cas!r:.100}")
    spec = specs.get(cas[0])
    if spec is not None:  # an unknown state fails as it is read
        check_size(spec, PUT, cas[1], cas[3], f"the compare-and-set of partition {pid}", max_key, max_value)


def check_size(spec: StateSpec, code: int, key: bytes, value: bytes, what: str, max_key: int, max_value: int) -> None:
    """Hold a stored key and value to the cluster's limits, as the client holds what it encodes.

    The client limits each encoded key and value, so a map entry's key (the
    key, then the user key) may take ``2 * max_key``, a list's value
    (its items' encodings, concatenated) any length with items of at most
    ``max_value``, and a RAW_PUT to a state with a TTL 8 more bytes (the
    expiry header). States of the system's own ('_' names) are not limited.
    """
    limit = 2 * max_key if spec.kind == "map" else max_key
    if len(key) > limit:
        detail = f" (a map entry's key is its key and user key, max_key_bytes={max_key} each)" if spec.kind == "map" else " (max_key_bytes)"
        raise SizeLimitError(f"key of {len(key)} bytes in {what} (state {spec.name!r}) is over the limit of {limit} bytes{detail}",
                             limit=limit, size=len(key), state=spec.name)
    header = EXPIRY_BYTES if code == RAW_PUT and spec.ttl else 0
    if len(value) - header <= max_value:
        return
    if spec.kind != "list":
        after = f" after its {header}-byte expiry header" if header else ""
        raise SizeLimitError(f"value of {len(value) - header} bytes{after} in {what} (state {spec.name!r}) is over the limit "
                             f"of {max_value} bytes (max_value_bytes)", limit=max_value, size=len(value) - header, state=spec.name)
    item = _largest_item(value, header)
    if item > max_value:
        raise SizeLimitError(f"value of {item} bytes (an item of the list in {what}, state {spec.name!r}) is over the limit of "
                             f"{max_value} bytes (max_value_bytes)", limit=max_value, size=item, state=spec.name)


def _largest_item(data: bytes, start: int = 0) -> int:
    """The largest encoded value in a concatenation of them (a list state's value); all of it if it is not one."""
    unpacker = msgpack.Unpacker(raw=True, max_buffer_size=len(data))
    unpacker.feed(memoryview(data)[start:])
    largest = offset = 0
    try:
        while offset < len(data) - start:
            unpacker.skip()
            largest, offset = max(largest, unpacker.tell() - offset), unpacker.tell()
    except Exception:  # noqa: BLE001 -- not encoded values (msgpack raises several types): one item
        return len(data) - start
    return largest
