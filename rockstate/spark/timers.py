"""Timers per key, kept in the state as an index by time on every partition.

A processor's timers live in one internal state of its operator, on the
partition of their key::

    b"t" + time + key   one entry per timer, the index by time: finding what
                        expired is a scan from the start that stops at the
                        first later timer, so it costs what expires, not the
                        number of keys (a task scans all its partitions with
                        one request per owner); its value is a copy of the
                        key's ``b"k"`` entry, so firing rewrites that entry
                        without reading it
    b"k" + key          one entry per key: its timers' times, sorted
                        (``list_timers``), read with the key's other states in
                        one request per owner for a whole batch of keys

(``time`` is 8 bytes, big-endian, offset by 2**63 so negative times sort
first; ``key`` is the key's rockstate encoding, which is prefix-free. An
index value that is empty, as older versions wrote it, is read from the
``b"k"`` entry instead.)

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
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

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


def _times(data: bytes) -> np.ndarray:
    """A ``b"k"`` entry's times."""
    return (np.frombuffer(data, dtype=">u8") - np.uint64(_OFFSET)).astype(np.int64)


def scan_before(backend, state: str, pids: Iterable[int], prefix: bytes, stop: bytes) -> dict[int, tuple[list[bytes], list[bytes]]]:
    """Per partition, the committed entries under ``prefix`` below ``stop`` as (keys, values): one request per
    owner for a page of every partition, then again for those whose page came back full, in pages that grow."""
    out: dict[int, tuple[list[bytes], list[bytes]]] = {pid: ([], []) for pid in pids}
    pending = dict.fromkeys(out)  # pid -> the last key read
    page_size = PAGE
    while pending:
        pages = backend.scan_many(state, {pid: (prefix, after, stop, page_size) for pid, after in pending.items()})
        for pid, (keys, values) in pages.items():
            out[pid][0].extend(keys)
            out[pid][1].extend(values)
            if len(keys) < page_size:
                del pending[pid]
            else:
                pending[pid] = keys[-1]
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


@dataclass
class Expired:
    """The timers a fire finds, in time order, as columns: ``times`` (ms), ``keys`` (encoded), ``pids``; each row
    is also a ``(time, key, partition)`` tuple."""

    times: np.ndarray
    keys: list[bytes]
    pids: np.ndarray
    entries: list[bytes]  # each key's ``b"k"`` entry as its index entry holds it (b"": not known)

    def __len__(self) -> int:
        return len(self.keys)

    def __iter__(self) -> Iterator[tuple[int, bytes, int]]:
        return zip(self.times.tolist(), self.keys, self.pids.tolist())


class TimerView:
    """One batch's view of an operator's timers: the committed index, overlaid by the batch's changes.

    Keys whose timers the batch changes go through the overlay (key -> time -> on/off, and the key's times as
    stored, read once). Keys whose timers only fire take a column-wise path instead: each index entry carries its
    key's times, so the key's new ``b"k"`` entry is what is left of them past the bound, with no read and no
    per-timer bookkeeping.
    """

    def __init__(self, backend, state: str) -> None:
        self.backend, self.state = backend, state
        self.overlay: dict[bytes, dict[int, bool]] = {}  # key -> time -> registered (False: deleted)
        self.pids: dict[bytes, int] = {}
        self.changed: dict[tuple[bytes, int], bool] = {}  # this round's changes, for the index
        self.fired: dict[int, int] = {}  # partition -> the bound its timers fired up to in this round
        # fired on the column path: key -> its partition, key -> its entry (two dicts: no tuple per key for the
        # garbage collector to count, which ran often enough to cost a fifth of a fire)
        self.fired_pids: dict[bytes, int] = {}
        self.fired_entries: dict[bytes, bytes] = {}
        self.rewrite: set[bytes] = set()  # keys whose entry this round changes through the overlay
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
                    self.times[key] = set(_times(data).tolist())

    def list(self, key: bytes, pid: int) -> list[int]:
        """The key's timers, in time order."""
        self.prefetch([key], [pid])
        times = set(self.times[key])
        for ms, on in self.overlay.get(key, {}).items():
            (times.add if on else times.discard)(ms)
        return sorted(times)

    def expired(self, pids: Iterable[int], bound: int) -> Expired:
        """Every timer at or before ``bound`` on ``pids``, in time order (ties in partition, then key order)."""
        pids = set(pids)
        keys: list[bytes] = []
        entries: list[bytes] = []
        parts: list[int] = []
        for pid, (index, values) in scan_before(self.backend, self.state, sorted(pids), BY_TIME, BY_TIME + time_key(bound + 1)).items():
            keys.extend(index)
            entries.extend(values)
            parts.extend([pid] * len(index))
        times = _times(b"".join(k[1:9] for k in keys))
        keys = [k[9:] for k in keys]
        if not self.overlay:
            order = np.argsort(times, kind="stable")  # merges the partitions' pages, each in time order
            if (order[1:] < order[:-1]).any():
                times, keys, entries, parts = times[order], [keys[i] for i in order], [entries[i] for i in order], [parts[i] for i in order]
            return Expired(times, keys, np.array(parts, dtype=np.int64), entries)
        # the batch's own changes: its deletions hide committed timers, its registrations add to them
        rows = {(ms, key): (pid, entry) for ms, key, pid, entry in zip(times.tolist(), keys, parts, entries)
                if self.overlay.get(key, {}).get(ms, True)}
        for key, changes in self.overlay.items():
            if self.pids[key] in pids:
                for ms, on in changes.items():
                    if on and ms <= bound:
                        rows.setdefault((ms, key), (self.pids[key], b""))
        ordered = sorted(rows.items(), key=lambda row: (row[0][0], row[1][0], row[0][1]))
        return Expired(np.array([ms for (ms, _), _ in ordered], dtype=np.int64), [key for (_, key), _ in ordered],
                       np.array([pid for _, (pid, _) in ordered], dtype=np.int64), [entry for _, (_, entry) in ordered])

    def fire(self, expired: Expired, bound: int) -> None:
        """Delete the timers ``expired(pids, bound)`` gave: each partition's index up to ``bound`` with one range
        delete (in ``finish``), and each key's entry rewritten there."""
        for pid in np.unique(expired.pids).tolist():
            self.fired[pid] = bound
        overlay = self.overlay
        if not overlay and all(expired.entries):  # the common case: every key on the column path
            self.fired_pids.update(zip(expired.keys, expired.pids.tolist()))
            self.fired_entries.update(zip(expired.keys, expired.entries))
            return
        for ms, key, pid, entry in zip(expired.times.tolist(), expired.keys, expired.pids.tolist(), expired.entries):
            if key in overlay or not entry:  # changed by the batch (its entry is not the stored one), or older data
                overlay.setdefault(key, {})[ms] = False
                self.changed.pop((key, ms), None)  # registered in this round: the range delete covers it
                self.pids[key] = pid
                self.rewrite.add(key)
            else:
                self.fired_pids[key], self.fired_entries[key] = pid, entry

    def finish(self, writer, keep: bool) -> None:
        """This round's changes: index entries put or deleted, each changed key's entry rewritten (one op per kind
        and partition)."""
        if not self.rewrite and not self.fired_pids:
            return
        puts: dict[int, tuple[list[bytes], list[bytes]]] = {}
        deletes: dict[int, list[bytes]] = {}

        def put(pid: int, entry: bytes, value: bytes) -> None:
            entries, values = puts.setdefault(pid, ([], []))
            entries.append(entry)
            values.append(value)

        for key in self.fired_pids.keys() & self.overlay.keys():  # changed after the fire: its fired timers join the overlay
            pid, entry = self.fired_pids.pop(key), self.fired_entries.pop(key)
            changes = self.overlay[key]
            for ms in _times(entry).tolist():
                if ms <= self.fired[pid]:
                    changes.setdefault(ms, False)  # unless re-registered (or deleted) after the fire
            self.rewrite.add(key)
        self.prefetch(list(self.rewrite), [self.pids[k] for k in self.rewrite])
        for (key, ms), on in self.changed.items():
            if not on:
                deletes.setdefault(self.pids[key], []).append(BY_TIME + time_key(ms) + key)
        for key in self.rewrite:
            times, pid = self.times[key], self.pids[key]
            for ms, on in self.overlay[key].items():
                (times.add if on else times.discard)(ms)
            if times:
                stamps = [time_key(ms) for ms in sorted(times)]
                entry = b"".join(stamps)
                put(pid, BY_KEY + key, entry)
                for stamp in stamps:  # every index entry of the key carries its new times
                    put(pid, BY_TIME + stamp + key, entry)
            else:
                deletes.setdefault(pid, []).append(BY_KEY + key)
        bounds = {pid: time_key(bound) for pid, bound in self.fired.items()}
        for pid in bounds:
            deletes.setdefault(pid, [])
        for key, entry in self.fired_entries.items():  # the column path: what is left past the bound
            pid = self.fired_pids[key]
            if entry[-8:] <= bounds[pid]:
                deletes[pid].append(BY_KEY + key)
                left = b""
            else:
                stamps = [entry[i:i + 8] for i in range(0, len(entry), 8)]
                left = b"".join(s for s in stamps if s > bounds[pid])
                put(pid, BY_KEY + key, left)
                for stamp in stamps:
                    if stamp > bounds[pid]:
                        put(pid, BY_TIME + stamp + key, left)
            if key in self.times:
                self.times[key] = set(_times(left).tolist())
        for pid, bound in self.fired.items():  # first: a timer registered after the fire stays
            writer.add(pid, (DELETE_RANGE, self.state, BY_TIME, BY_TIME + time_key(bound + 1)))
        for pid, entries in deletes.items():
            if entries:
                writer.add(pid, (DELETE_MANY, self.state, entries, None))
        for pid, (entries, values) in puts.items():
            writer.add(pid, (PUT_MANY, self.state, entries, values))
        self.changed, self.fired, self.fired_pids, self.fired_entries, self.rewrite = {}, {}, {}, {}, set()
        if not keep:  # else the task's later rounds read this one's changes from memory (they are staged, not committed)
            self.overlay, self.pids, self.times = {}, {}, {}
