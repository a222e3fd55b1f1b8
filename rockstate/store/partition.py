"""One partition: a RocksDB instance with a column family per state.

Values of a state with a TTL are stored behind an 8-byte expiry header
(milliseconds since the epoch, big-endian); an expired entry reads as absent
and is removed by ``sweep_expired``. A list state's stored value is its items'
encodings concatenated, so ``APPEND`` is a read-modify-write under the
partition's lock.

All writes to a partition hold ``lock``: a checkpoint takes the same lock to
order its barrier between writes.

Replication. On a replicated partition's primary, ``shipper`` is set: every
write (whatever made it: a client's write or compare-and-set, a staged
batch, a request id, a TTL deletion) gets the next sequence number, stored in
the same WriteBatch (state ``_replication``), and is handed to the shipper as
it was stored (``RAW_PUT``s with their TTL headers; an append as its item, the
whole list only in a TTL state), under the lock, so in the order it was applied. A backup applies those batches with
``apply_replicated``; ``backup`` keeps its own sweeps off it.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections import deque
from itertools import islice, repeat
from typing import Any, Callable, Iterable, Iterator, Sequence

from rocksdict import Checkpoint, Rdict, ReadOptions, WriteBatch

from ..errors import PartitionUnavailableError
from ..ops import APPEND, DELETE, DELETE_MANY, DELETE_PREFIX, DELETE_RANGE, PUT, PUT_MANY, RAW_PUT, RAW_PUT_MANY, Op
from . import requests
from .catalog import RESERVED_PREFIX, StateSpec, unknown_state
from .resources import Resources

__all__ = ["APPEND", "DELETE", "DELETE_MANY", "DELETE_PREFIX", "DELETE_RANGE", "PUT", "PUT_MANY", "RAW_PUT", "Op",
           "Partition", "now_ms", "prefix_end"]

_EXPIRY = struct.Struct(">Q")
_SEQ = struct.Struct(">Q")
REPLICATION, SEQ_KEY = "_replication", b"seq"  # the last replicated batch this copy holds


def _each(call: Callable[..., object], *columns: Iterable[Any]) -> None:
    """``call`` on each row of the columns, in a C loop: rocksdict's WriteBatch has no bulk put, and a Python
    loop's own work was a fifth of 1,000 puts' time (218 -> 173 µs)."""
    deque(map(call, *columns), maxlen=0)


def now_ms() -> int:
    return int(time.time() * 1000)


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with ``prefix`` (None: no bound)."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return None
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


class Partition:
    def __init__(self, pid: int, path: str, resources: Resources, specs: dict[str, StateSpec], states: Iterable[str] = ()) -> None:
        """``states``: column families opened (created if missing) with the DB, in one open: each created later
        by ``ensure_state`` costs a MANIFEST write and sync of its own (~17 ms on a loaded disk, against ~6 ms
        for the same family created at open)."""
        self.pid = pid
        self.path = path
        self.lock = threading.RLock()
        self._recording: list | None = None
        self.shipper: Callable[[int, int, list], None] | None = None  # (pid, seq, stored ops): a primary's backups
        self.backup = False  # a backup's copy: written only by its primary's batches
        self._resources = resources
        self._specs = specs  # the store's catalog, shared: states defined later appear here
        opts = resources.options()
        names = Rdict.list_cf(path, opts) if os.path.exists(os.path.join(path, "CURRENT")) else ["default"]
        families = {n: resources.options() for n in [*names, *states] if n != "default"}
        self._seq: int | None = None  # read on first use
        self.db: Rdict | None = Rdict(path, opts, column_families=families)
        # Any: rocksdict's stubs take a multi-get's keys as an invariant list of scalars, not list[bytes]
        self._families: dict[str, Any] = {n: self.db.get_column_family(n) for n in families}
        self._handles = {n: self.db.get_column_family_handle(n) for n in families}
        resources.memtables(len(families))

    # -- states ----------------------------------------------------------

    def column_families(self) -> list[Rdict]:
        """One handle per state, for reading RocksDB properties (metrics)."""
        return list(self._families.values())

    def ensure_state(self, name: str) -> None:
        with self.lock:
            if name not in self._families:
                self._families[name] = self._open().create_column_family(name, self._resources.options())
                self._handles[name] = self._open().get_column_family_handle(name)
                self._resources.memtables(1)

    def states(self) -> list[str]:
        return list(self._families)

    def _family(self, state: str) -> Any:  # an Rdict column family (see _families)
        self._open()
        try:
            return self._families[state]
        except KeyError:
            if state in self._specs or state.startswith(RESERVED_PREFIX):
                self.ensure_state(state)
                return self._families[state]
            raise unknown_state(state, self._specs) from None

    def _open(self) -> Rdict:
        if self.db is None:
            raise PartitionUnavailableError(f"partition {self.pid} is closed (closing, moving or being restored)", partition=self.pid)
        return self.db

    def _ttl_ms(self, state: str) -> int | None:
        spec = self._specs.get(state)
        return int(spec.ttl * 1000) if spec and spec.ttl else None

    # -- writes ----------------------------------------------------------

    def write(self, ops: Sequence[Op], request: bytes | None = None) -> bool:
        """Apply ``ops`` atomically (one RocksDB WriteBatch), once per ``request`` id (see requests.py);
        answers whether they applied now. A move in progress records them, the request id with them."""
        with self.lock:
            if request is not None:
                if self.raw_get_one(requests.REQUESTS, request) is not None:
                    return False
                ops = [*ops, (PUT, requests.REQUESTS, request, requests.WRITTEN)]
            if self.shipper is None:
                self._open().write(self._batch(ops))
            else:
                stored: list = []
                batch = self._batch(ops, stored)
                seq = self.seq() + 1
                stored.append((RAW_PUT, REPLICATION, SEQ_KEY, _SEQ.pack(seq)))
                batch.put(SEQ_KEY, stored[-1][3], self._handles[REPLICATION])
                self._open().write(batch)
                self._seq = seq
                self.shipper(self.pid, seq, stored)
            if self._recording is not None:
                self._recording.extend(ops)
            return True

    def seq(self) -> int:
        """The last replicated batch this copy holds (0: none)."""
        with self.lock:
            if self._seq is None:
                self._family(REPLICATION)
                stored = self.raw_get_one(REPLICATION, SEQ_KEY)
                self._seq = 0 if stored is None else _SEQ.unpack(stored)[0]
            return self._seq

    def apply_replicated(self, seq: int, stored: list) -> None:
        """A backup: its primary's batch ``seq``, as the primary stored it (its sequence number included)."""
        with self.lock:
            for state in {op[1] for op in stored}:
                if state not in self._families:  # a new state only: the lock again costs a GIL round per batch
                    self.ensure_state(state)
            self._open().write(self._batch(stored))
            self._seq = seq

    def compare_and_set(self, state: str, key: bytes, expected: bytes | None, new: bytes, request: bytes | None = None) -> bool:
        """Store ``new`` at ``key`` if its live value is ``expected`` (None: absent); returns whether it did.

        Atomic under the lock; an applied one is a PUT through ``write``, so a move records it. A retry of
        ``request`` is answered from its first attempt's outcome, kept with the request id.
        """
        with self.lock:
            seen = None if request is None else self.raw_get_one(requests.REQUESTS, request)
            if seen is not None:
                return seen == requests.SET
            applied = self.get_many(state, [key])[0] == expected
            ops = [(PUT, state, key, new)] if applied else []
            if request is not None:
                ops.append((PUT, requests.REQUESTS, request, requests.SET if applied else requests.NOT_SET))
            if ops:
                self.write(ops)
            return applied

    def forget_requests(self, window: float, now: float | None = None) -> None:
        """Drop the request ids whose time is more than ``window`` seconds before ``now``."""
        with self.lock:  # a primary handing the partition over turns ``backup`` on under the lock: no write after
            if requests.REQUESTS in self.states() and not self.backup:
                self.write([(DELETE_RANGE, requests.REQUESTS, b"", requests.cutoff(window, now))])

    # -- copies: checkpoints and moves -------------------------------------

    def flush(self) -> None:
        """Flush every column family's memtable (best effort: the partition may be closing)."""
        db: Any = self.db  # None once closed: the flush fails, as below
        try:
            for name in ["default", *self._families]:
                (db if name == "default" else db.get_column_family(name)).flush()
        except Exception:  # noqa: BLE001 -- closed or dropped meanwhile: the caller's next step says so
            pass

    def hard_link_copy(self, target: str, record: bool = False, then: Callable[[], None] | None = None) -> float:
        """A RocksDB checkpoint (hard links) into ``target``, which must not exist; returns how long writes paused.

        The memtables are flushed first, outside the lock, so little is left to
        flush while writes wait. With ``record``, every write after the copy is
        recorded, to be taken by ``take_recorded`` (a move's last delta). ``then`` runs under the lock
        right after the copy (a replica copy's position).
        """
        self.flush()
        with self.lock:
            start = time.perf_counter()
            Checkpoint(self._open()).create_checkpoint(target)
            if record:
                self._recording = []
            if then is not None:
                then()
            return time.perf_counter() - start

    def take_recorded(self, stop: bool = True) -> list:
        """The writes recorded since ``hard_link_copy(record=True)`` or the last take; ``stop`` ends recording."""
        with self.lock:
            ops = self._recording or []
            self._recording = None if stop else []
            return ops

    def _batch(self, ops: Sequence[Op], stored: list | None = None) -> WriteBatch:
        """The ops as one WriteBatch; ``stored`` (a list) gets them as stored, for the backups."""
        batch = WriteBatch(raw_mode=True)
        pending: dict[tuple[str, bytes], bytes | None] = {}  # list values as this batch leaves them
        headers: dict[str, bytes | None] = {}
        for op, state, key, value in ops:
            if state not in headers:
                self._family(state)
                ttl = self._ttl_ms(state)
                headers[state] = _EXPIRY.pack(now_ms() + ttl) if ttl else None
            handle, header = self._handles[state], headers[state]
            as_stored = (op, state, key, value)
            if op == PUT_MANY:
                values = [header + v for v in value] if header else value
                _each(batch.put, key, values, repeat(handle))
                self._track(pending, state, key, value)
                as_stored = (RAW_PUT_MANY, state, key, values)
            elif op == DELETE_MANY:
                _each(batch.delete, key, repeat(handle))
                self._track(pending, state, key, [None] * len(key))
            elif op == PUT:
                batch.put(key, header + value if header else value, handle)
                self._track(pending, state, [key], [value])
                as_stored = (RAW_PUT, state, key, header + value if header else value)
            elif op == DELETE:
                batch.delete(key, handle)
                self._track(pending, state, [key], [None])
            elif op == APPEND:
                old = pending[state, key] if (state, key) in pending else self.get_many(state, [key])[0]
                pending[state, key] = new = (old or b"") + value
                batch.put(key, header + new if header else new, handle)
                if header:  # the expiry is the primary's clock's: the whole value (without TTL a backup appends alike)
                    as_stored = (RAW_PUT, state, key, header + new)
            elif op == RAW_PUT:
                batch.put(key, value, handle)
                self._track(pending, state, [key], [value[8:] if header and value is not None else value])
            elif op == RAW_PUT_MANY:  # a backup applying its primary's batch
                _each(batch.put, key, value, repeat(handle))
                self._track(pending, state, key, [v[8:] for v in value] if header else value)
            elif op == DELETE_RANGE:
                batch.delete_range(key, value, handle)
            elif op == DELETE_PREFIX:
                end = prefix_end(key)
                if end is None:  # only 0xff bytes: delete key by key
                    doomed = [k for k, _ in self.scan(state, key)]
                    for k in doomed:
                        batch.delete(k, handle)
                    as_stored = (DELETE_MANY, state, doomed, None)
                else:
                    batch.delete_range(key, end, handle)
                    as_stored = (DELETE_RANGE, state, key, end)
            else:
                raise ValueError(f"unknown write op {op!r}")
            if stored is not None:
                stored.append(as_stored)
        return batch

    def _track(self, pending: dict, state: str, keys: Sequence[bytes], values: Sequence[bytes | None]) -> None:
        """Remember what the batch leaves in a list state, for a later APPEND in it."""
        spec = self._specs.get(state)
        if spec is not None and spec.kind == "list":
            pending.update(((state, k), v) for k, v in zip(keys, values))

    # -- reads -----------------------------------------------------------

    def raw_get(self, state: str, keys: list[bytes]) -> list[bytes | None]:
        """Stored values as they are (TTL headers included)."""
        return self._family(state).get(keys)

    def raw_get_one(self, state: str, key: bytes) -> bytes | None:
        """``raw_get`` of one key, at a third of its cost (a write's request id is looked up on every write)."""
        return self._family(state).get(key)

    def get_many(self, state: str, keys: list[bytes]) -> list[bytes | None]:
        family = self._family(state)
        values = [family.get(keys[0])] if len(keys) == 1 else family.get(keys)  # one key: a third of a multi-get's cost
        if self._ttl_ms(state) is None:
            return values
        now = now_ms()
        return [v[8:] if v is not None and _EXPIRY.unpack_from(v)[0] > now else None for v in values]

    def scan(self, state: str, prefix: bytes = b"", after: bytes | None = None, limit: int | None = None,
             stop: bytes | None = None) -> list[tuple[bytes, bytes]]:
        """Live entries whose key starts with ``prefix``, in key order, after ``after`` and before ``stop``, at most ``limit``."""
        if self._ttl_ms(state) is None:  # RocksDB bounds the scan: no Python step per entry (half the cost)
            end = prefix_end(prefix)
            read = ReadOptions()
            if stop is not None or end is not None:
                read.set_iterate_upper_bound(min(b for b in (stop, end) if b is not None))
            entries = self._family(state).items(from_key=after if after is not None and after > prefix else prefix, read_opt=read)
            found = list(islice(entries, None if limit is None else limit + 1))
            if found and found[0][0] == after:
                del found[0]
            return found[:limit]
        out = []
        for key, value in self._iter(state, prefix, after):
            if stop is not None and key >= stop:
                break
            out.append((key, value))
            if limit is not None and len(out) >= limit:
                break
        return out

    def _iter(self, state: str, prefix: bytes, after: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        ttl, now = self._ttl_ms(state), now_ms()
        it = self._family(state).iter()
        it.seek(after if after is not None and after > prefix else prefix)
        while it.valid():
            key = it.key()
            if not key.startswith(prefix):
                break
            if key != after:
                value = it.value()
                if ttl is None:
                    yield key, value
                elif _EXPIRY.unpack_from(value)[0] > now:
                    yield key, value[8:]
            it.next()

    def count(self, state: str, prefix: bytes = b"") -> tuple[int, int]:
        """(live entries, their key+value bytes)."""
        n = size = 0
        for key, value in self._iter(state, prefix, None):
            n += 1
            size += len(key) + len(value)
        return n, size

    # -- raw entries ------------------------------------------------------

    def raw_items(self, state: str, start: bytes = b"", end: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Stored entries with start <= key < end, as they are on disk (TTL headers, expired ones too)."""
        it = self._family(state).iter()
        it.seek(start)
        while it.valid() and (end is None or it.key() < end):
            yield it.key(), it.value()
            it.next()

    # -- maintenance -----------------------------------------------------

    def sweep_expired(self, state: str, batch_size: int = 1000, should_stop: Callable[[], bool] = lambda: False) -> int:
        """Delete expired entries of a TTL state, a batch at a time; returns how many."""
        if self._ttl_ms(state) is None:
            return 0
        removed, now = 0, now_ms()
        it = self._family(state).iter()
        it.seek_to_first()
        expired = []
        while it.valid() and not should_stop():
            if _EXPIRY.unpack_from(it.value())[0] <= now:
                expired.append(it.key())
            it.next()
            if len(expired) >= batch_size or (expired and not it.valid()):
                removed += self._delete_if_expired(state, expired, now)
                expired = []
        return removed

    def _delete_if_expired(self, state: str, keys: list[bytes], now: int) -> int:
        with self.lock:  # re-check under the lock: a write may have refreshed an entry (or a handover begun)
            if self.backup:
                return 0
            gone = [k for k, v in zip(keys, self._families[state].get(keys)) if v is not None and _EXPIRY.unpack_from(v)[0] <= now]
            if gone:
                self.write([(DELETE_MANY, state, gone, None)])
            return len(gone)

    def close(self) -> None:
        db = self.detach()
        if db is not None:
            db.close()

    def detach(self) -> Rdict | None:
        """Closed to every user from now on; its RocksDB is the caller's to close (``close`` waits for its
        background work: a store drops partitions in the background, trash.py)."""
        with self.lock:
            db, self.db = self.db, None
            self._resources.memtables(-len(self._families))
            self._families.clear()
            self._handles.clear()
            return db
