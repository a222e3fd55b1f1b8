"""Timers per key, kept in the state as an index by time on every partition.

A processor's timers live in one internal state of its operator, on the
partition of their key, under two entries each::

    b"t" + time + key   the index by time: finding what expired is a scan from
                        the start that stops at the first later timer, so it
                        costs what expires, not the number of keys
    b"k" + key + time   the key's own timers (``list_timers``)

(``time`` is 8 bytes, big-endian, offset by 2**63 so negative times sort
first; ``key`` is the key's rockstate encoding, which is prefix-free.)

Timers are state like any other: registering or deleting one is a write of
the batch (staged as its version in a streaming query, so a re-run replaces
it), a batch sees the timers batches before it left plus its own changes,
and they move, fail over and are checkpointed with their partition. Each
task fires the timers of the partitions it is given (every rockstate
partition belongs to one task of the operator, whether or not rows of it
arrive), after its input rows, in time order, and deletes each after its
handler, as Spark does; so a timer fires exactly once, in the first batch
whose processing time (or watermark) reaches it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..ops import DELETE_MANY, PUT_MANY

_TIME = struct.Struct(">Q")
_OFFSET = 1 << 63
BY_TIME, BY_KEY = b"t", b"k"
PAGE = 256


def _time(ms: int) -> bytes:
    return _TIME.pack(int(ms) + _OFFSET)


def _ms(data: bytes) -> int:
    return _TIME.unpack(data)[0] - _OFFSET


class TimerValues:
    """The batch's clocks, as Spark's ``TimerValues``: processing time and watermark in ms (-1: none in this mode)."""

    def __init__(self, processing_ms, watermark_ms) -> None:
        self._processing, self._watermark = processing_ms, watermark_ms  # ints, or callables read on first use

    def get_current_processing_time_in_ms(self) -> int:
        if callable(self._processing):
            self._processing = self._processing()
        return self._processing

    def get_current_watermark_in_ms(self) -> int:
        if callable(self._watermark):
            self._watermark = self._watermark()
        return self._watermark

    def __repr__(self) -> str:
        return f"TimerValues(processing={self.get_current_processing_time_in_ms()}, watermark={self.get_current_watermark_in_ms()})"


@dataclass(frozen=True)
class ExpiredTimerInfo:
    """The timer that fired, as Spark's ``ExpiredTimerInfo``."""

    expiry_time_in_ms: int

    def get_expiry_time_in_ms(self) -> int:
        return self.expiry_time_in_ms


class TimerView:
    """One batch's view of an operator's timers: the committed index, overlaid by the batch's changes."""

    def __init__(self, backend, state: str) -> None:
        self.backend, self.state = backend, state
        self.overlay: dict[tuple[bytes, int], bool] = {}  # (key, time) -> registered (False: deleted)
        self.pids: dict[bytes, int] = {}
        self.dirty: set[tuple[bytes, int]] = set()
        self.listed: dict[bytes, set[int]] = {}  # a key's committed timers, once read

    def change(self, keys: Sequence[bytes], pids: Iterable[int], times: Iterable[int], on: bool) -> None:
        for key, pid, ms in zip(keys, pids, times):
            entry = (key, int(ms))
            self.overlay[entry] = on
            self.pids[key] = int(pid)
            self.dirty.add(entry)

    def list(self, key: bytes, pid: int) -> list[int]:
        """The key's timers, in time order."""
        if key not in self.listed:
            prefix, n = BY_KEY + key, len(BY_KEY) + len(key)
            self.listed[key] = {_ms(k[n:]) for k, _ in self._scan(pid, prefix)}
        times = set(self.listed[key])
        for (k, ms), on in self.overlay.items():
            if k == key:
                (times.add if on else times.discard)(ms)
        return sorted(times)

    def expired(self, pids: Iterable[int], bound: int) -> list[tuple[int, bytes, int]]:
        """(time, key, partition) of every timer at or before ``bound`` on ``pids``, in time order."""
        pids = set(pids)
        found: set[tuple[int, bytes, int]] = set()
        for pid in sorted(pids):
            for k, _ in self._scan(pid, BY_TIME, stop=bound):
                ms, key = _ms(k[1:9]), k[9:]
                if self.overlay.get((key, ms), True):
                    found.add((ms, key, pid))
        for (key, ms), on in self.overlay.items():
            if on and ms <= bound and self.pids[key] in pids:
                found.add((ms, key, self.pids[key]))
        return sorted(found)

    def _scan(self, pid: int, prefix: bytes, stop: int | None = None) -> list[tuple[bytes, bytes]]:
        """The committed entries under ``prefix``; with ``stop``, index entries up to that time only."""
        out, after = [], None
        while True:
            page = self.backend.scan(self.state, pid, prefix, after, PAGE)
            if stop is not None:
                keep = [e for e in page if _ms(e[0][1:9]) <= stop]
                out.extend(keep)
                if len(keep) < len(page):
                    return out
            else:
                out.extend(page)
            if len(page) < PAGE:
                return out
            after = page[-1][0]

    def finish(self, writer, keep: bool) -> None:
        """The batch's registrations and deletions as one PUT_MANY and one DELETE_MANY per partition."""
        puts: dict[int, list[bytes]] = {}
        deletes: dict[int, list[bytes]] = {}
        for key, ms in self.dirty:
            pid, t = self.pids[key], _time(ms)
            (puts if self.overlay[key, ms] else deletes).setdefault(pid, []).extend([BY_TIME + t + key, BY_KEY + key + t])
        for pid, keys in puts.items():
            writer.add(pid, (PUT_MANY, self.state, keys, [b""] * len(keys)))
        for pid, keys in deletes.items():
            writer.add(pid, (DELETE_MANY, self.state, keys, None))
        self.dirty = set()
        if not keep:  # the task's later batches read this one's changes from memory (they are staged)
            self.overlay, self.pids, self.listed = {}, {}, {}
