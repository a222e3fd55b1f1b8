"""Client histories, as Jepsen records them.

Client threads tell a ``History`` when each operation starts (``invoke``) and
how it ended: ``ok`` (it happened; a read or compare-and-set says its result),
``fail`` (it certainly did not happen) or ``info`` (nobody knows: a reply was
lost, so it may have taken effect at any time after its invocation, or never).
A process has one operation open at a time; times come from one monotonic
clock. ``rockstate.testing.history`` checks what was recorded.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Hashable

READ, WRITE, CAS = "read", "write", "cas"


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Any = _Unknown()  # the output of an operation whose outcome is unknown


def frozen(value: Any) -> Any:
    """A hashable stand-in for a value (lists and dicts, as msgpack decodes them, are not)."""
    if isinstance(value, (list, tuple)):
        return tuple(map(frozen, value))
    if isinstance(value, dict):
        return frozenset((frozen(k), frozen(v)) for k, v in value.items())
    return value


@dataclass(frozen=True)
class Event:
    type: str  # invoke | ok | fail | info
    op: int
    process: Hashable
    kind: str
    key: Any
    value: Any  # invoke: the input; ok: the output
    time: float
    error: str | None = None


@dataclass(frozen=True)
class Operation:
    """One completed operation. ``value``: a write's value, a compare-and-set's (expected, new);
    ``output``: what a read read, whether a compare-and-set applied (UNKNOWN for ``info``)."""

    id: int
    process: Hashable
    kind: str
    key: Any
    value: Any
    output: Any
    call: float
    ret: float  # math.inf when the outcome is unknown
    status: str = "ok"  # ok | info

    def __str__(self) -> str:
        if self.kind == READ:
            what = f"read -> {self.output!r}"
        elif self.kind == WRITE:
            what = f"write {self.value!r}"
        elif self.kind == CAS:
            what = f"cas {self.value[0]!r} -> {self.value[1]!r}: {self.output!r}"
        else:
            what = self.kind
        return f"#{self.id} p{self.process} {self.key!r} {what} [{self.call:.4f}, {self.ret:.4f}] {self.status}"


class History:
    """A thread-safe record of invocations and completions."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._events: list[Event] = []
        self._open: dict[int, Event] = {}  # op -> its invocation
        self._busy: dict[Hashable, int] = {}  # process -> its open op

    def invoke(self, process: Hashable, kind: str, key: Any, value: Any = None) -> int:
        """Record the start of an operation; returns its id, for ``ok``/``fail``/``info``."""
        if kind not in (READ, WRITE, CAS):
            raise ValueError(f"unknown operation kind {kind!r}")
        with self._lock:
            if process in self._busy:
                raise ValueError(f"process {process!r} still has operation {self._busy[process]} open")
            op = len(self._events)
            event = Event("invoke", op, process, kind, key, value, self.clock())
            self._events.append(event)
            self._open[op] = event
            self._busy[process] = op
            return op

    def ok(self, op: int, output: Any = None) -> None:
        self._complete("ok", op, output, None)

    def fail(self, op: int, error: object = None) -> None:
        """The operation certainly did not take effect."""
        self._complete("fail", op, None, error)

    def info(self, op: int, error: object = None) -> None:
        """The operation may or may not have taken effect."""
        self._complete("info", op, None, error)

    def _complete(self, type_: str, op: int, output: Any, error: object) -> None:
        with self._lock:
            start = self._open.pop(op)
            del self._busy[start.process]
            self._events.append(Event(type_, op, start.process, start.kind, start.key, output, self.clock(),
                                      None if error is None else repr(error)))

    @property
    def events(self) -> list[Event]:
        with self._lock:
            return list(self._events)

    def operations(self) -> list[Operation]:
        """Completed operations; a failed one is left out, one still open counts as ``info``."""
        ends: dict[int, Event] = {}
        starts: list[Event] = []
        for e in self.events:
            (starts.append(e) if e.type == "invoke" else ends.__setitem__(e.op, e))
        out = []
        for s in starts:
            end = ends.get(s.op)
            if end is not None and end.type == "fail":
                continue
            known = end is not None and end.type == "ok"
            value = tuple(map(frozen, s.value)) if s.kind == CAS else frozen(s.value)
            output = frozen(end.value) if known else UNKNOWN
            out.append(Operation(s.op, s.process, s.kind, s.key, value, output, s.time,
                                 end.time if known else math.inf, "ok" if known else "info"))
        return out
