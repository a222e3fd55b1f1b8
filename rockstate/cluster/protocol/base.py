"""What every message module shares: the numeric bounds, fields checked against their ranges, names checked
against the one name pattern (``rockstate/names.py``)."""

from __future__ import annotations

import math
from typing import ClassVar

from ...errors import InvalidNameError, ProtocolError
from ...names import RULE, is_name
from ...rpc.frames import MAX_FRAME
from ...rpc.messages import Message

__all__ = ["I64", "MAX_FRAME", "MAX_SCAN_LIMIT", "U32", "U64", "Message", "Ranged"]

U32, U64, I64 = (1 << 32) - 1, (1 << 64) - 1, (1 << 63) - 1  # what staging's and storage's struct formats hold
MAX_SCAN_LIMIT = 100_000  # entries in one scan page (the client asks for 1000)


class Ranged:
    """A message whose numeric fields must lie in ``ranges``: {field: (lowest, highest or None)}.

    None (where the field allows it) is not checked, nor a value of the wrong
    type (``Message.from_wire`` names that); a float must also be finite.
    """

    ranges: ClassVar[dict[str, tuple[float, float | None]]] = {}
    op: ClassVar[str]  # declared here for the type checker: a Ranged is a Message too (rpc.messages sets both)
    _types: ClassVar[dict[str, tuple[type, ...] | None]]
    names: ClassVar[dict[str, str]] = {}  # {field: what it names}: a str (None where allowed) matching names.PATTERN

    def __post_init__(self) -> None:
        for name, what in self.names.items():
            value = getattr(self, name)
            if value is None or is_name(value):
                continue
            raise InvalidNameError(f"field {name!r} of {self.op!r} message: invalid {what} {str(value)[:80]!r}: use {RULE}",
                                   op=self.op, field=name)
        for name, (low, high) in self.ranges.items():
            value = getattr(self, name)
            if type(value) not in (int, float):
                continue
            if low <= value and (high is None or value <= high) and (type(value) is int or math.isfinite(value)):
                continue
            kind = "a finite number" if float in (self._types[name] or (float,)) else "an int"
            allowed = f"{kind} from {low} to {_show(high)}" if high is not None else f"{kind} >= {low}"
            if type(None) in (self._types[name] or ()):
                allowed = f"None or {allowed}"
            raise ProtocolError(f"field {name!r} of {self.op!r} message must be {allowed}, not {value!r}", op=self.op, field=name)


def _show(n: float) -> str:
    """A bound as people read it: 2**64 - 1 rather than 18446744073709551615."""
    p = int(n).bit_length()
    if type(n) is int and n >= 1 << 20:
        if n == 1 << (p - 1):
            return f"2**{p - 1}"
        if (1 << p) - n < 16:
            return f"2**{p} - {(1 << p) - n}"
    return str(n)
