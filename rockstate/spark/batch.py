"""What one processor batch reads and writes: committed state in, one backend write out.

A batch (the rows handed to ``handle_batch``, or the keys of one round of
``handle_input_rows`` calls) reads committed state through the backend's
``get_many``, one request per owner, and keeps every write in memory. At the
end of the batch, ``Batch.finish`` turns the writes into ops and
``BatchWriter.flush`` sends them as ONE ``backend.write`` (one request per
owner). Reads in the batch see its own writes; nothing is visible to anyone
else before the flush.

Each state has a view: ``KeyedView`` for value and list states (the whole
stored value of a key), ``MapView`` for map states (entries under a key),
``timers.TimerView`` for the operator's timers. The
views only hold encoded bytes; the handles in ``processor`` encode and decode.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..runs import objects, read_columns, write_order
from ..states import SCAN_PAGE, Backend
from ..store.partition import DELETE_MANY, DELETE_PREFIX, PUT_MANY
from .expiry import add_entries
from .timers import TimerView


class BatchWriter:
    """A batch's state writes, grouped by partition, sent by ``flush`` as one backend write.

    This is the one place state leaves an executor: in a streaming query
    ``StagingWriter`` replaces ``flush`` with "stage these ops as the
    micro-batch's version" and leaves everything else as it is.
    """

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.ops: dict[int, list] = {}

    def add(self, pid: int, op: tuple) -> None:
        self.ops.setdefault(pid, []).append(op)

    def flush(self) -> None:
        """Send every buffered op in one ``backend.write`` (the backend sends one request per owner)."""
        if self.ops:
            ops, self.ops = self.ops, {}
            self.backend.write(ops)


def _fetch(backend: Backend, state: str, keys: Sequence[bytes], pids: np.ndarray) -> list[bytes | None]:
    """Committed values of ``keys`` (pids[i] is keys[i]'s partition), in order: one request per owner."""
    return read_columns(backend.read_runs, state, list(keys), pids)


def _add_columns(writer: BatchWriter, op: int, state: str, keys: list[bytes], pids: np.ndarray, values: list[bytes] | None) -> None:
    """``op`` (PUT_MANY or DELETE_MANY) over rows grouped by partition, in key order (``write_order``)."""
    order, groups = write_order(pids, keys)
    keys = objects(keys)[order].tolist()
    values = None if values is None else objects(values)[order].tolist()
    for pid, a, b in groups:
        writer.add(pid, (op, state, keys[a:b], None if values is None else values[a:b]))


def _write_ops(writer: BatchWriter, state: str, entries: dict[bytes, bytes | None], pids: dict[bytes, int]) -> None:
    """One PUT_MANY and one DELETE_MANY (None values) per partition."""
    puts = [k for k, v in entries.items() if v is not None]
    deletes = [k for k, v in entries.items() if v is None]
    if puts:
        _add_columns(writer, PUT_MANY, state, puts, np.fromiter(map(pids.__getitem__, puts), np.int64, len(puts)), [entries[k] for k in puts])
    if deletes:
        _add_columns(writer, DELETE_MANY, state, deletes, np.fromiter(map(pids.__getitem__, deletes), np.int64, len(deletes)), None)


class KeyedView:
    """A value or list state as this batch sees it: committed values, overlaid by the batch's writes.

    Vectorized puts and deletes that come before any other use of the view
    stay as the columns they came in (``columns``) and go to the writer as
    they are; anything else first settles them into the ``known``/``dirty``
    maps, where the last write of a key wins.
    """

    def __init__(self, backend: Backend, state: str) -> None:
        self.backend, self.state = backend, state
        self.known: dict[bytes, bytes | None] = {}  # prefetched or written in this batch
        self.dirty: dict[bytes, int] = {}  # written key -> partition
        self.columns: list[tuple[list[bytes], np.ndarray, list[bytes] | None]] = []  # (keys, pids, values or None: deletes)
        self.ttl: tuple[str, int] | None = None  # a TTL state's (index by expiry, expiry of this batch's writes)

    def _settle(self) -> None:
        for keys, pids, values in self.columns:
            self.known.update(zip(keys, values or [None] * len(keys)))
            self.dirty.update(zip(keys, pids.tolist()))
        self.columns = []

    def prefetch(self, keys: Sequence[bytes], pids: np.ndarray) -> None:
        """Read the keys this batch is about to use, so later reads are served from memory."""
        self._settle()
        self.known.update(zip(keys, self.read(keys, pids)))

    def read(self, keys: Sequence[bytes], pids: np.ndarray) -> list[bytes | None]:
        self._settle()
        known = self.known
        if not known:
            return _fetch(self.backend, self.state, keys, pids)
        missing = [i for i, k in enumerate(keys) if k not in known]
        fetched = dict(zip(missing, _fetch(self.backend, self.state, [keys[i] for i in missing], pids[missing])))
        return [fetched[i] if i in fetched else known[k] for i, k in enumerate(keys)]

    def get(self, key: bytes, pid: int) -> bytes | None:
        self._settle()
        if key in self.known:
            return self.known[key]
        return self.read([key], np.array([pid]))[0]

    def write(self, keys: Sequence[bytes], pids: Sequence[int], values: Sequence[bytes | None]) -> None:
        """Set (None: delete) each key's whole stored value; the last write of a key wins."""
        self._settle()
        self.known.update(zip(keys, values))
        self.dirty.update(zip(keys, pids))

    def write_columns(self, keys: list[bytes], pids: np.ndarray, values: list[bytes] | None) -> None:
        """Vectorized puts (``values``) or deletes (``values`` None), in order."""
        if self.known or self.dirty:
            self.write(keys, pids.tolist(), values or [None] * len(keys))
        else:
            self.columns.append((keys, pids, values))

    def finish(self, writer: BatchWriter, keep: bool) -> None:
        for keys, pids, values in self.columns:
            _add_columns(writer, DELETE_MANY if values is None else PUT_MANY, self.state, keys, pids, values)
        written = {k: self.known[k] for k in self.dirty}
        _write_ops(writer, self.state, written, self.dirty)
        if self.ttl:
            puts = [(k, pid) for keys, pids, values in self.columns if values is not None for k, pid in zip(keys, pids.tolist())]
            puts += [(k, self.dirty[k]) for k, v in written.items() if v is not None]
            add_entries(writer, self.ttl[0], self.ttl[1], self.state, [k for k, _ in puts], [p for _, p in puts])
        if keep:  # what this batch wrote, for the task's later batches (its writes are staged, not in the state)
            for keys, _, values in self.columns:
                written.update(zip(keys, values or [None] * len(keys)))
        self.known, self.dirty, self.columns = written if keep else {}, {}, []


class MapView:
    """A map state as this batch sees it: per key, committed entries overlaid by the batch's writes.

    Entries live under ``key + user_key``. Vectorized reads (``read``) are
    point reads, one request per owner for the batch; per-key reads (``get``,
    ``entries``) read the key's whole map with one scan the first time the
    batch touches it, and are served from memory after that.
    """

    def __init__(self, backend: Backend, state: str) -> None:
        self.backend, self.state = backend, state
        self.loaded: dict[bytes, dict[bytes, bytes]] = {}  # key -> its committed entries
        self.overlay: dict[bytes, dict[bytes, bytes | None]] = {}  # key -> user key -> written value (None: removed)
        self.cleared: set[bytes] = set()  # keys whose committed entries this batch removed
        self.dirty: dict[bytes, int] = {}  # written key -> partition
        self.ttl: tuple[str, int] | None = None  # as KeyedView's

    def _committed(self, key: bytes, pid: int) -> dict[bytes, bytes]:
        if key in self.cleared:
            return {}
        if key not in self.loaded:
            entries, after, n = {}, None, len(key)
            while True:
                page = self.backend.scan(self.state, pid, key, after, SCAN_PAGE)
                entries.update((k[n:], v) for k, v in page)
                if len(page) < SCAN_PAGE:
                    break
                after = page[-1][0]
            self.loaded[key] = entries
        return self.loaded[key]

    def entries(self, key: bytes, pid: int) -> dict[bytes, bytes]:
        """Every (user key, value) of ``key``'s map as this batch leaves it."""
        merged = dict(self._committed(key, pid))
        for user_key, value in self.overlay.get(key, {}).items():
            if value is None:
                merged.pop(user_key, None)
            else:
                merged[user_key] = value
        return merged

    def get(self, key: bytes, pid: int, user_key: bytes) -> bytes | None:
        written = self.overlay.get(key)
        if written is not None and user_key in written:
            return written[user_key]
        return self._committed(key, pid).get(user_key)

    def read(self, keys: Sequence[bytes], pids: np.ndarray, user_keys: Sequence[bytes]) -> list[bytes | None]:
        out: list[bytes | None] = [None] * len(keys)
        missing = []
        for i, (key, user_key) in enumerate(zip(keys, user_keys)):
            written = self.overlay.get(key)
            if written is not None and user_key in written:
                out[i] = written[user_key]
            elif key in self.cleared:
                out[i] = None
            elif key in self.loaded:
                out[i] = self.loaded[key].get(user_key)
            else:
                missing.append(i)
        if missing:
            found = _fetch(self.backend, self.state, [keys[i] + user_keys[i] for i in missing], pids[missing])
            for i, value in zip(missing, found):
                out[i] = value
        return out

    def write(self, keys: Sequence[bytes], pids: Sequence[int], user_keys: Sequence[bytes], values: Sequence[bytes | None]) -> None:
        overlay = self.overlay
        for key, pid, user_key, value in zip(keys, pids, user_keys, values):
            overlay.setdefault(key, {})[user_key] = value
            self.dirty[key] = pid

    def clear(self, keys: Sequence[bytes], pids: Sequence[int]) -> None:
        for key, pid in zip(keys, pids):
            self.cleared.add(key)
            self.overlay[key] = {}
            self.dirty[key] = pid

    def finish(self, writer: BatchWriter, keep: bool) -> None:
        for key in self.cleared & self.dirty.keys():  # before the entries' puts: ops of a partition apply in order
            writer.add(self.dirty[key], (DELETE_PREFIX, self.state, key, None))
        entries = {key + uk: v for key in self.dirty for uk, v in self.overlay[key].items()}
        pids = {key + uk: self.dirty[key] for key in self.dirty for uk in self.overlay[key]}
        _write_ops(writer, self.state, entries, pids)
        if self.ttl:
            puts = [(key, uk) for key in self.dirty for uk, v in self.overlay[key].items() if v is not None]
            add_entries(writer, self.ttl[0], self.ttl[1], self.state, [k for k, _ in puts], [self.dirty[k] for k, _ in puts],
                        [uk for _, uk in puts])
        if keep:  # the task's later batches see these maps as this one left them (see KeyedView.finish)
            self.dirty = {}
        else:
            self.loaded, self.overlay, self.cleared, self.dirty = {}, {}, set(), {}


class Batch:
    """The views of every state for one batch, and the key ``handle_input_rows`` is called for."""

    def __init__(self, backend: Backend, writer: BatchWriter, keep: bool = False) -> None:
        """``keep``: the next batch of the task reads this one's writes from memory (they are staged)."""
        self.backend, self.writer, self.keep = backend, writer, keep
        self.views: dict[str, KeyedView | MapView | TimerView] = {}
        self.current: tuple[bytes, int] | None = None  # (encoded key, partition) in per-key mode

    def view(self, state: str, kind: str) -> KeyedView | MapView | TimerView:
        view = self.views.get(state)
        if view is None:
            view = self.views[state] = {"map": MapView, "timers": TimerView}.get(kind, KeyedView)(self.backend, state)
        return view

    def finish(self) -> None:
        """Turn every view's writes into ops and flush them: one backend write for the whole batch."""
        for view in self.views.values():
            view.finish(self.writer, self.keep)
        self.writer.flush()
