"""One partition: a key group of its process's RocksDB (``keygroups.py``), a column family per state.

Every key goes to RocksDB behind the partition's prefix and comes back without it; what a partition hands
out (its replicated batches, a move's recorded writes, a copy) is without it, so the other side may hold it
under another layout.

How ops become RocksDB entries is ``writes.py``'s: values of a state with a TTL behind an expiry header (an expired
entry reads as absent and is removed by ``sweep_expired``), a list's items concatenated (``APPEND`` reads, under the
partition's lock).

All writes to a partition hold ``lock``: a checkpoint takes the same lock to
order its barrier between writes.

Replication. On a replicated partition's primary, ``shipper`` is set: every
write (whatever made it: a client's write or compare-and-set, a staged
batch, a request id, a TTL deletion) gets the next sequence number, stored in
the same WriteBatch (state ``_replication``), and is handed to the shipper as
it was stored (``writes.to_batch``), under the lock, so in the order it was applied. A backup applies those batches
with ``apply_replicated``; ``backup`` keeps its own sweeps off it.
"""

from __future__ import annotations

import struct
import threading
from itertools import islice, repeat
from typing import Any, Callable, Iterator, Sequence

from rocksdict import Rdict, ReadOptions, WriteBatch

from ..errors import PartitionUnavailableError
from ..ops import APPEND, DELETE, DELETE_MANY, DELETE_PREFIX, DELETE_RANGE, PUT, PUT_MANY, RAW_PUT, RAW_PUT_MANY, Op
from . import requests
from .catalog import RESERVED_PREFIX, StateSpec, unknown_state
from .keygroups import NodeDB, bounds
from .writes import EXPIRY, now_ms, prefix_end, to_batch

__all__ = ["APPEND", "DELETE", "DELETE_MANY", "DELETE_PREFIX", "DELETE_RANGE", "PUT", "PUT_MANY", "RAW_PUT", "Op",
           "Partition", "now_ms", "prefix_end"]

SEQ = struct.Struct(">Q")
REPLICATION, SEQ_KEY = "_replication", b"seq"  # the last replicated batch this copy holds


class Partition:
    def __init__(self, pid: int, node_db: NodeDB, specs: dict[str, StateSpec]) -> None:
        self.pid = pid
        self.lock = threading.RLock()
        self._recording: list | None = None
        self.shipper: Callable[[int, int, list, int | None], None] | None = None  # (pid, seq, stored ops, their size): a primary's backups
        self.backup = False  # a backup's copy: written only by its primary's batches
        self._specs = specs  # the store's catalog, shared: states defined later appear here
        self._seq: int | None = None  # read on first use
        self.node_db: NodeDB | None = node_db
        self.prefix, self.end = bounds(pid)
        self._families = node_db.families  # shared by the store's partitions
        self._handles = node_db.handles
        self._kinds = node_db.kinds

    @property
    def db(self) -> Rdict | None:
        return None if self.node_db is None else self.node_db.db

    # -- states ----------------------------------------------------------

    def column_families(self) -> list[Rdict]:
        """One handle per state (shared with the store's other partitions)."""
        return list(self._families.values())

    def ensure_state(self, name: str) -> None:
        self._open().ensure(name)

    def states(self) -> list[str]:
        return list(self._families)

    def family(self, state: str) -> Any:  # an Rdict column family (see NodeDB.families)
        self._open()
        try:
            return self._families[state]
        except KeyError:
            if state in self._specs or state.startswith(RESERVED_PREFIX):
                self.ensure_state(state)
                return self._families[state]
            raise unknown_state(state, self._specs) from None

    def check_open(self) -> None:
        self._open()

    def _open(self) -> NodeDB:
        if self.node_db is None:
            raise PartitionUnavailableError(f"partition {self.pid} is closed (closing, moving or being restored)", partition=self.pid)
        return self.node_db

    def _ttl_ms(self, state: str) -> int | None:
        spec = self._specs.get(state)
        return int(spec.ttl * 1000) if spec and spec.ttl else None

    def state_kind(self, state: str) -> tuple[Any, int | None, bool]:
        """A state's column family handle, its TTL in ms (None: none) and whether it is a list, looked up once for
        the store's partitions: the write path asks per op (a state's spec never changes once defined)."""
        kind = self._kinds.get(state)
        if kind is None:
            self.family(state)  # an unknown state raises; a reserved one is made
            spec = self._specs.get(state)
            kind = self._kinds[state] = (self._handles[state], self._ttl_ms(state), spec is not None and spec.kind == "list")
        return kind

    # -- writes ----------------------------------------------------------

    def write(self, ops: Sequence[Op], request: bytes | None = None) -> bool:
        """Apply ``ops`` atomically (one RocksDB WriteBatch), once per ``request`` id (see requests.py);
        answers whether they applied now. A move in progress records them, the request id with them."""
        with self.lock:
            batch = WriteBatch(raw_mode=True)
            written = self.stage(ops, request, batch)
            if written is None:
                return False
            self._open().db.write(batch)
            written()
            return True

    def stage(self, ops: Sequence[Op], request: bytes | None, batch: WriteBatch) -> Callable[[], None] | None:
        """``write``'s work up to the RocksDB write, into ``batch`` (which may hold other partitions' ops: the
        store writes a request's partitions in one WriteBatch); answers what to do once ``batch`` is written, or
        None when ``request`` applied before. Under the lock, held until then."""
        if request is not None:
            if self.raw_get_one(requests.REQUESTS, request) is not None:
                return None
            ops = [*ops, (PUT, requests.REQUESTS, request, requests.WRITTEN)]
        if self.shipper is None:
            to_batch(self, ops, batch)
            return lambda: self.committed(ops)
        stored: list = []
        to_batch(self, ops, batch, stored)
        seq = self.seq() + 1
        batch.put(self.prefix + SEQ_KEY, SEQ.pack(seq), self._handles[REPLICATION])  # not shipped: a backup stores its own
        return lambda: self.committed(ops, seq, stored)

    def committed(self, ops: Sequence[Op], seq: int | None = None, stored: list | None = None, size: int | None = None) -> None:
        """Staged ``ops`` are written (under the lock): a replicated partition's batch ``seq`` goes to its backups
        as ``stored`` (``size``: its ``stored_bytes``, when the caller knows it), and a move in progress records the ops."""
        if seq is not None:
            self._seq = seq
            self.shipper(self.pid, seq, stored, size)  # type: ignore[misc, arg-type]  # a seq is staged (with its stored ops) only while shipped
        if self._recording is not None:
            self._recording.extend(ops)

    def seq(self) -> int:
        """The last replicated batch this copy holds (0: none)."""
        with self.lock:
            if self._seq is None:
                self.family(REPLICATION)
                stored = self.raw_get_one(REPLICATION, SEQ_KEY)
                self._seq = 0 if stored is None else SEQ.unpack(stored)[0]
            return self._seq

    def apply_replicated(self, seq: int, stored: list) -> None:
        """A backup: its primary's batch ``seq``, as the primary stored it, and ``seq`` as the last it holds."""
        with self.lock:
            batch = WriteBatch(raw_mode=True)
            self.stage_replicated(seq, stored, batch)
            self._open().db.write(batch)
            self._seq = seq

    def stage_replicated(self, seq: int, stored: list, batch: WriteBatch) -> None:
        """``apply_replicated`` up to the RocksDB write, into ``batch``; the caller holds the lock until it is
        written, then sets ``applied(seq)``."""
        for state in {op[1] for op in stored}:
            if state not in self._families:  # a new state only
                self.ensure_state(state)
        to_batch(self, stored, batch)
        batch.put(self.prefix + SEQ_KEY, SEQ.pack(seq), self.state_kind(REPLICATION)[0])  # a primary ships it not: 1 op of 3 a piece at P=1024

    def stage_replicated_puts(self, seq: int, stored: list, keys: list, values: list, handles: list) -> bool:
        """``stage_replicated`` of a batch of puts only (a batch put's piece: RAW_PUT_MANY and its request id's
        RAW_PUT) as entries appended to ``keys``, ``values`` and ``handles``, which the caller puts in one C loop for
        all its pieces (piece by piece, ``to_batch`` was ~30 % of a backup's Python at P=1024); False, nothing
        appended, for any other batch, or one of a state not yet known here."""
        kinds = self._kinds
        for op in stored:
            code = op[0]
            if (code != RAW_PUT and code != RAW_PUT_MANY) or op[1] not in kinds:  # lengths: ReplicaApply.received
                return False
        p, start = self.prefix, len(keys)
        try:
            for code, state, key, value in stored:
                handle = kinds[state][0]
                if code == RAW_PUT_MANY:
                    keys += [p + k for k in key]
                    values += value
                    handles += repeat(handle, len(key))
                else:
                    keys.append(p + key)
                    values.append(value)
                    handles.append(handle)
        except TypeError:  # a key that is not bytes: none of this batch's entries stay
            del keys[start:], values[start:], handles[start:]
            raise
        keys.append(p + SEQ_KEY)
        values.append(SEQ.pack(seq))
        handles.append(self.state_kind(REPLICATION)[0])
        return True

    def applied(self, seq: int) -> None:
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

    def export_copy(self, target: str, record: bool = False) -> None:
        """A copy of the partition alone, as SST files at ``target`` (which must not exist): its ``cut``, exported."""
        node_db, cut = self.cut(record)
        node_db.export({self.pid: cut}, target)

    def cut(self, record: bool = False, then: Callable[[], None] | None = None) -> tuple[NodeDB, dict]:
        """The partition's keys and values as of now (``NodeDB.snapshots``), taken under the lock, for
        ``NodeDB.export``: writes pause only meanwhile. With ``record``, every write after the cut is recorded, to
        be taken by ``take_recorded`` (a move's last delta). ``then`` runs under the lock right after the cut (a
        replica copy's position)."""
        with self.lock:
            node_db = self._open()
            snapshots = node_db.snapshots(self.pid)
            if record:
                self._recording = []
            if then is not None:
                then()
        return node_db, snapshots

    def empty(self) -> bool:
        """No key in any state (None-safe: a closed partition is not known to be empty)."""
        return self.node_db is not None and self.node_db.empty(self.pid)

    def take_recorded(self, stop: bool = True) -> list:
        """The writes recorded since ``cut(record=True)`` or the last take; ``stop`` ends recording."""
        with self.lock:
            ops = self._recording or []
            self._recording = None if stop else []
            return ops

    # -- reads -----------------------------------------------------------

    def raw_get(self, state: str, keys: list[bytes]) -> list[bytes | None]:
        """Stored values as they are (TTL headers included)."""
        p = self.prefix
        return self.family(state).get([p + k for k in keys])

    def raw_get_one(self, state: str, key: bytes) -> bytes | None:
        """``raw_get`` of one key, at a third of its cost (a write's request id is looked up on every write)."""
        return self.family(state).get(self.prefix + key)

    def get_many(self, state: str, keys: list[bytes]) -> list[bytes | None]:
        family, p = self.family(state), self.prefix
        # one key: a third of a multi-get's cost
        values = [family.get(p + keys[0])] if len(keys) == 1 else family.get([p + k for k in keys])
        return self.live(state, values)

    def live(self, state: str, values: list[bytes | None]) -> list[bytes | None]:
        """Values of ``state`` as stored, as read: without a TTL state's header, an expired one None."""
        if self._ttl_ms(state) is None:
            return values
        now = now_ms()
        return [v[8:] if v is not None and EXPIRY.unpack_from(v)[0] > now else None for v in values]

    def scan(self, state: str, prefix: bytes = b"", after: bytes | None = None, limit: int | None = None,
             stop: bytes | None = None) -> list[tuple[bytes, bytes]]:
        """Live entries whose key starts with ``prefix``, in key order, after ``after`` and before ``stop``, at most ``limit``."""
        if self._ttl_ms(state) is None:  # RocksDB bounds the scan: no Python step per entry (half the cost)
            p, end = self.prefix, prefix_end(prefix)
            read = ReadOptions()
            read.set_iterate_upper_bound(min(p + b for b in (stop, end) if b is not None) if stop is not None or end is not None else self.end)
            start = after if after is not None and after > prefix else prefix
            entries = self.family(state).items(from_key=p + start, read_opt=read)
            cut = len(p)
            found = [(k[cut:], v) for k, v in islice(entries, None if limit is None else limit + 1)]
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
        it = self.family(state).iter()
        full, cut = self.prefix + prefix, len(self.prefix)
        it.seek(self.prefix + after if after is not None and after > prefix else full)
        while it.valid():
            key = it.key()
            if not key.startswith(full):
                break
            key = key[cut:]
            if key != after:
                value = it.value()
                if ttl is None:
                    yield key, value
                elif EXPIRY.unpack_from(value)[0] > now:
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
        it = self.family(state).iter()
        p, cut = self.prefix, len(self.prefix)
        stop = self.end if end is None else p + end
        it.seek(p + start)
        while it.valid() and it.key() < stop:
            yield it.key()[cut:], it.value()
            it.next()

    # -- maintenance -----------------------------------------------------

    def sweep_expired(self, state: str, batch_size: int = 1000, should_stop: Callable[[], bool] = lambda: False) -> int:
        """Delete expired entries of a TTL state, a batch at a time; returns how many."""
        if self._ttl_ms(state) is None:
            return 0
        removed, now = 0, now_ms()
        expired = []
        entries = self.raw_items(state)
        for key, value in entries:
            if should_stop():
                break
            if EXPIRY.unpack_from(value)[0] <= now:
                expired.append(key)
            if len(expired) >= batch_size:
                removed += self._delete_if_expired(state, expired, now)
                expired = []
        if expired:
            removed += self._delete_if_expired(state, expired, now)
        return removed

    def _delete_if_expired(self, state: str, keys: list[bytes], now: int) -> int:
        with self.lock:  # re-check under the lock: a write may have refreshed an entry (or a handover begun)
            if self.backup or self.node_db is None:
                return 0
            gone = [k for k, v in zip(keys, self.raw_get(state, keys)) if v is not None and EXPIRY.unpack_from(v)[0] <= now]
            if gone:
                self.write([(DELETE_MANY, state, gone, None)])
            return len(gone)

    def close(self) -> None:
        """Closed to every user from now on (the store's RocksDB stays open: its other partitions)."""
        with self.lock:
            self.node_db = None
