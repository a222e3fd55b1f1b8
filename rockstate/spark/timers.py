"""Timers per key, kept in the state as an index by time on every partition.

A processor's timers live in one internal state of its operator, on the
partition of their key::

    b"t" + time + key   one entry per timer, the index by time: finding what
                        expired is a scan from the start that stops at the
                        first later timer, so it costs what expires, not the
                        number of keys (a task scans all its partitions with
                        one request per owner)
    b"k" + key          one entry per key: its timers' times (``list_timers``),
                        read with the key's other states in one request per
                        owner for a whole batch of keys

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

from ..ops import DELETE_MANY, DELETE_RANGE, PUT_MANY

_TIME = struct.Struct(">Q")
_OFFSET = 1 << 63
BY_TIME, BY_KEY = b"t", b"k"
PAGE, MAX_PAGE = 1024, 16384  # index pages grow while they come back full


def time_key(ms: int) -> bytes:
    """A time in ms as 8 bytes that sort as the times do (negative ones first)."""
    return _TIME.pack(int(ms) + _OFFSET)


def _ms(data: bytes) -> int:
    return _TIME.unpack(data)[0] - _OFFSET


def scan_before(backend, state: str, pids: Iterable[int], prefix: bytes, stop: bytes) -> dict[int, list[bytes]]:
    """Per partition, the committed keys under ``prefix`` below ``stop``: one request per owner for a page of every
    partition, then again for those whose page came back full, in pages that grow."""
    out: dict[int, list[bytes]] = {pid: [] for pid in pids}
    pending = dict.fromkeys(out)  # pid -> the last key read
    page_size = PAGE
    while pending:
        pages = backend.scan_many(state, {pid: (prefix, after, stop, page_size) for pid, after in pending.items()})
        for pid, page in pages.items():
            out[pid].extend(k for k, _ in page)
            if len(page) < page_size:
                del pending[pid]
            else:
                pending[pid] = page[-1][0]
        page_size = min(page_size * 2, MAX_PAGE)
    return out


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
        self.overlay: dict[bytes, dict[int, bool]] = {}  # key -> time -> registered (False: deleted)
        self.pids: dict[bytes, int] = {}
        self.changed: dict[tuple[bytes, int], bool] = {}  # this round's changes, for the index
        self.fired: dict[int, int] = {}  # partition -> the bound its timers fired up to in this round
        self.rewrite: set[bytes] = set()  # keys whose entry this round changes
        self.times: dict[bytes, set[int]] = {}  # a key's timers as the state holds them, once read

    def change(self, keys: Sequence[bytes], pids: Iterable[int], times: Iterable[int], on: bool) -> None:
        overlay, changed = self.overlay, self.changed
        for key, pid, ms in zip(keys, pids, times):
            ms = int(ms)
            overlay.setdefault(key, {})[ms] = on
            changed[key, ms] = on
            self.pids[key] = int(pid)
            self.rewrite.add(key)

    def prefetch(self, keys: Sequence[bytes], pids: Iterable[int]) -> None:
        """Read the timers of the keys not read yet: one ``get_many`` per owner for all of them."""
        missing: dict[int, list[bytes]] = {}
        for key, pid in zip(keys, pids):
            if key not in self.times:
                missing.setdefault(int(pid), []).append(key)
                self.times[key] = set()
        if not missing:
            return
        found = self.backend.get_many(self.state, {pid: [BY_KEY + k for k in ks] for pid, ks in missing.items()})
        for pid, ks in missing.items():
            for key, data in zip(ks, found[pid]):
                if data:
                    self.times[key] = {_ms(data[i:i + 8]) for i in range(0, len(data), 8)}

    def list(self, key: bytes, pid: int) -> list[int]:
        """The key's timers, in time order."""
        self.prefetch([key], [pid])
        times = set(self.times[key])
        for ms, on in self.overlay.get(key, {}).items():
            (times.add if on else times.discard)(ms)
        return sorted(times)

    def expired(self, pids: Iterable[int], bound: int) -> list[tuple[int, bytes, int]]:
        """(time, key, partition) of every timer at or before ``bound`` on ``pids``, in time order."""
        pids = set(pids)
        found: set[tuple[int, bytes, int]] = set()
        overlay = self.overlay
        for pid, keys in scan_before(self.backend, self.state, sorted(pids), BY_TIME, BY_TIME + time_key(bound + 1)).items():
            for k in keys:
                ms, key = _ms(k[1:9]), k[9:]
                if overlay.get(key, {}).get(ms, True):
                    found.add((ms, key, pid))
        for key, times in overlay.items():
            if self.pids[key] in pids:
                found.update((ms, key, self.pids[key]) for ms, on in times.items() if on and ms <= bound)
        return sorted(found)

    def fire(self, expired: Sequence[tuple[int, bytes, int]], bound: int) -> None:
        """Delete the timers ``expired(pids, bound)`` gave: each partition's index up to ``bound`` with one range delete."""
        for ms, key, pid in expired:
            self.overlay.setdefault(key, {})[ms] = False
            self.pids[key] = pid
            self.changed.pop((key, ms), None)  # registered in this round: the range delete covers it
            self.fired[pid] = bound
            self.rewrite.add(key)

    def finish(self, writer, keep: bool) -> None:
        """This round's changes: index entries put or deleted, each changed key's entry rewritten (one op per kind and partition)."""
        if not self.rewrite:
            return
        keys = self.rewrite
        self.prefetch(list(keys), [self.pids[k] for k in keys])
        puts: dict[int, tuple[list[bytes], list[bytes]]] = {}
        deletes: dict[int, list[bytes]] = {}
        for (key, ms), on in self.changed.items():
            entry = BY_TIME + time_key(ms) + key
            if on:
                put = puts.setdefault(self.pids[key], ([], []))
                put[0].append(entry)
                put[1].append(b"")
            else:
                deletes.setdefault(self.pids[key], []).append(entry)
        for key in keys:
            times = self.times[key]
            for ms, on in self.overlay[key].items():
                (times.add if on else times.discard)(ms)
            if times:
                put = puts.setdefault(self.pids[key], ([], []))
                put[0].append(BY_KEY + key)
                put[1].append(b"".join(time_key(ms) for ms in sorted(times)))
            else:
                deletes.setdefault(self.pids[key], []).append(BY_KEY + key)
        for pid, bound in self.fired.items():  # first: a timer registered after the fire stays
            writer.add(pid, (DELETE_RANGE, self.state, BY_TIME, BY_TIME + time_key(bound + 1)))
        for pid, entries in deletes.items():
            writer.add(pid, (DELETE_MANY, self.state, entries, None))
        for pid, (entries, values) in puts.items():
            writer.add(pid, (PUT_MANY, self.state, entries, values))
        self.changed, self.fired, self.rewrite = {}, {}, set()
        if not keep:  # else the task's later rounds read this one's changes from memory (they are staged, not committed)
            self.overlay, self.pids, self.times = {}, {}, {}
