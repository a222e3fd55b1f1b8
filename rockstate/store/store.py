"""One process's partitions: key groups of one RocksDB (``keygroups.py``).

Directory layout::

    <path>/LOCK           flock: one process opens a store at a time
    <path>/STORE.json     {"partitions": P, "format": 2}: P fixed when the store is created
    <path>/states.json    the catalog: name -> kind, ttl
    <path>/db/            the RocksDB: every partition's keys behind its prefix
    <path>/p0042/         (format 1, a RocksDB per partition) imported into db/ when the partition opens,
                          then removed (trash.py)
"""

from __future__ import annotations

import fcntl
import operator
import os
import threading
import uuid
from itertools import chain, repeat
from typing import IO, Any, Callable, Iterable, Mapping, cast

from rocksdict import WriteBatch

from ..config import StoreConfig
from ..errors import (
    PartitionCountError,
    PartitionRangeError,
    PartitionUnavailableError,
    ProtocolError,
    RockstateError,
    StoreClosedError,
    StoreLockedError,
)
from ..files import read_json, write_json
from . import requests
from .catalog import StateSpec, unknown_state
from .checks import check_compare_and_set, check_ops, check_put_pieces
from .keygroups import NodeDB, is_rocksdb
from .many import holding
from .partition import Partition
from .puts import stage_puts
from .resources import Resources
from .trash import Trash


def partition_dir(pid: int) -> str:
    return f"p{pid:04d}"


class Store:
    """Partitions of one process. ``owned=None`` opens all P partitions (embedded mode)."""

    def __init__(self, path: str, config: StoreConfig | None = None, owned: Iterable[int] | None = None,
                 reserved: Iterable[str] = ()) -> None:
        """``reserved``: internal states (``_requests``, ``_replication``) every partition opened here will use: their
        column families are created when a partition opens, not by its first write (a node's, on its event loop)."""
        self.config = config or StoreConfig()
        self.path = os.path.abspath(path)
        self.partitions = self.config.partitions
        os.makedirs(self.path, exist_ok=True)
        self._lock_file: IO[str] | None = _lock(self.path)
        try:
            self._check_partition_count()
            self.specs: dict[str, StateSpec] = {
                name: StateSpec.from_dict(d) for name, d in cast(dict[str, Any], read_json(self._catalog_path, {}) or {}).items()
            }
            self.resources = Resources(self.config.memory_bytes, self.config.max_open_files)
            self._parts: dict[int, Partition] = {}
            self.reserved = tuple(reserved)
            self.db = NodeDB(os.path.join(self.path, "db"), self.resources, [*self.specs, *self.reserved])
            self._mutex = threading.Lock()
            self._opening: dict[int, threading.Lock] = {}  # pid -> held while a format-1 copy of it is imported
            self._trash = Trash(self.path)
            self.open_partitions(range(self.partitions) if owned is None else owned)
        except BaseException:
            self._close_parts_and_unlock()
            raise
        self._stop = threading.Event()
        self._sweeper = threading.Thread(target=self._sweep_loop, name="rockstate-ttl-sweeper", daemon=True)
        self._sweeper.start()

    @property
    def _catalog_path(self) -> str:
        return os.path.join(self.path, "states.json")

    def _check_partition_count(self) -> None:
        meta_path = os.path.join(self.path, "STORE.json")
        meta: Any = read_json(meta_path)
        if meta is None or "id" not in meta:  # a new store, or one of format 1 (its partitions imported as they open)
            meta = {"partitions": self.partitions, **(meta or {}), "format": 2, "id": uuid.uuid4().hex}
            write_json(meta_path, meta)
        self.id: str = meta["id"]  # names its files in checkpoint storage
        if meta["partitions"] != self.partitions:
            raise PartitionCountError(
                f"store at {self.path} was created with {meta['partitions']} partitions; "
                f"it cannot be opened with {self.partitions} (the partition count is fixed at creation)",
                expected=meta["partitions"],
            )

    # -- states ----------------------------------------------------------

    def define_state(self, spec: StateSpec, create: bool = True) -> StateSpec:
        """Create a state, or check that an existing one has the same kind and TTL; ``create=False``: only
        the check (UnknownStateError naming close matches if there is no such state)."""
        with self._mutex:
            existing = self.specs.get(spec.name)
            if existing is not None:
                existing.check_same(spec)
                return existing
            if not create:
                raise unknown_state(spec.name, self.specs)
            self.specs[spec.name] = spec
            write_json(self._catalog_path, {n: s.to_dict() for n, s in self.specs.items()})
        self.db.ensure(spec.name)
        return spec

    # -- partitions ------------------------------------------------------

    def check_pid(self, pid: object) -> int:
        if type(pid) is not int or not 0 <= pid < self.partitions:
            raise PartitionRangeError(f"partition {pid!r} is out of range 0..{self.partitions - 1}")
        return pid

    def partition(self, pid: int) -> Partition:
        try:
            return self._parts[pid]
        except KeyError:
            if self._lock_file is None:
                raise StoreClosedError("the store is closed") from None
            self.check_pid(pid)
            raise PartitionUnavailableError(f"partition {pid} is not open on this store", partition=pid) from None

    def owned(self) -> list[int]:
        return sorted(self._parts)

    def partition_path(self, pid: int) -> str:
        return os.path.join(self.path, partition_dir(pid))

    def open_partition(self, pid: int) -> Partition:
        """The partition's key group, served from now on (what the store holds of it: nothing, or what it held
        when it closed). A format-1 directory of it is imported first."""
        self.check_pid(pid)
        with self._mutex:
            part = self._parts.get(pid)
            if part is not None:
                return part
            opening = self._opening.setdefault(pid, threading.Lock())
        with opening:
            with self._mutex:
                part = self._parts.get(pid)
                if part is not None:
                    return part
            try:
                old = self.partition_path(pid)
                if is_rocksdb(old):
                    self.db.import_copies({pid: (old, None)})
                    self._trash.discard(old)
                part = Partition(pid, self.db, self.specs)
                with self._mutex:
                    self._parts[pid] = part
            finally:
                with self._mutex:
                    self._opening.pop(pid, None)
        for name in list(self.specs):  # one defined while it opened (define_state did not see it yet)
            part.ensure_state(name)
        return part

    def open_partitions(self, pids: Iterable[int]) -> list[Partition]:
        return [self.open_partition(pid) for pid in pids]

    def close_partition(self, pid: int, drop: bool = False) -> None:
        """Not served from now on; ``drop``: its keys deleted too (a range deletion: cheap on an event loop), so a
        partition opened here again starts empty."""
        with self._mutex:
            opening = self._opening.get(pid)
        if opening is not None:
            with opening:  # an open in flight ends first: then it is closed
                pass
        with self._mutex:
            part = self._parts.pop(pid, None)
        if part is not None:
            with part.lock:  # no write of it lands after the range deletion
                part.close()
                if drop:
                    self.db.drop(pid)
        elif drop and self._lock_file is not None:
            self.db.drop(pid)

    def drop_all_but(self, keep: set[int]) -> None:
        """Every partition but ``keep`` dropped: what the store holds of them deleted, format-1 folders too."""
        for pid in range(self.partitions):
            if pid not in keep and (pid in self._parts or not self.db.empty(pid)):
                self.close_partition(pid, drop=True)
        for name in os.listdir(self.path):
            if name.startswith("p") and name[1:].isdigit() and int(name[1:]) not in keep:
                self._trash.discard(os.path.join(self.path, name))

    def wait_dropped(self) -> None:
        """Until every format-1 directory removed so far is deleted."""
        self._trash.wait()

    def replace_partitions(self, dirs: Mapping[int, str | tuple[str, int | None]], states: dict[str, dict] | None = None,
                           holds: Mapping[str, Iterable[int]] = {}) -> None:
        """Each partition becomes the copy in ``dirs[pid]`` (a restored or moved-in copy: a standalone RocksDB of
        it, or ``(path, source pid)``: that partition's range of a key-group RocksDB), and is opened.

        Restore, failover and moves all end here. ``states``: the copy's catalog
        (a checkpoint's), merged into this store's before the partitions open. ``holds[path]``: every partition
        an export at ``path`` holds, when only some are taken (``NodeDB.import_copies``).
        A partition is closed while its copy goes in: it is either the old one or the new one.
        """
        for pid in dirs:
            self.close_partition(self.check_pid(pid))
        if states:
            with self._mutex:  # the specs dict is shared with the open partitions: update it in place
                self.specs.update({name: StateSpec.from_dict(data) for name, data in states.items()})
                write_json(self._catalog_path, {n: s.to_dict() for n, s in self.specs.items()})
        self.db.import_copies({pid: (d, None) if isinstance(d, str) else d for pid, d in dirs.items()}, holds=holds)
        self.open_partitions(dirs)

    # -- operations (the node serves these per partition) ----------------

    def write(self, pid: int, ops: list, request: bytes | None = None) -> bool:
        """Apply ``ops`` to partition ``pid`` once per ``request`` id; answers whether they applied now."""
        return self.partition(pid).write(ops, request)

    def check_ops(self, groups: list) -> None:
        """Every group's ops, as received over the wire: shape, states, and the key and value size limits."""
        if check_put_pieces(groups, self.specs, self.config.max_key_bytes, self.config.max_value_bytes):
            return  # a batch put's pieces, all at once
        for pid, ops in groups:
            check_ops(ops, self.specs, f"partition {pid}", self.config.max_key_bytes, self.config.max_value_bytes)

    def write_groups(self, groups: list, request: bytes | None = None) -> list[bool]:
        """A node's ``Write``: every group's ops checked before any applies, then all groups applied in one RocksDB
        WriteBatch (atomically, once per ``request`` id and partition: one that applied before is left out);
        answers which applied now. One WAL append however many partitions the request reaches."""
        requests.check_id(request, "write")
        self.check_ops(groups)
        return self.write_all(groups, request)

    def write_all(self, groups: list, request: bytes | None = None) -> list[bool]:
        """``write_groups`` of ops made here (the embedded backend's): not checked again."""
        if not groups:
            return []
        parts = [self.partition(pid) for pid, _ in groups]
        locks = sorted({part.pid: part for part in parts}.values(), key=lambda part: part.pid)
        if len(locks) < len(parts) or len(parts) == 1:  # one partition (or one twice: each group its own write)
            return [self._write_one(part, ops, request) for part, (_, ops) in zip(parts, groups)]
        with holding(part.lock for part in locks):  # in partition order: two requests never wait for each other's
            for part in locks:
                part.check_open()
            batch = WriteBatch(raw_mode=True)
            try:
                staged = stage_puts(parts, groups, request, batch)  # a batch put's shape: every piece at once
            except (KeyError, TypeError, ValueError) as e:
                raise not_bytes(e, "ops of a PUT_MANY")
            if staged is None:
                staged = self._stage_each(parts, groups, request, batch)
            applied, written = staged
            self.db.db.write(batch)
            written()
            return applied

    @staticmethod
    def _stage_each(parts: list[Partition], groups: list, request: bytes | None,
                    batch: WriteBatch) -> tuple[list[bool], Callable[[], None]]:
        pieces = []
        for part, (pid, ops) in zip(parts, groups):
            try:
                pieces.append(part.stage(ops, request, batch))
            except (KeyError, TypeError, ValueError) as e:
                raise not_bytes(e, f"ops of partition {pid}")

        def written() -> None:
            for done in pieces:
                if done is not None:
                    done()
        return [done is not None for done in pieces], written

    def _write_one(self, part: Partition, ops: list, request: bytes | None) -> bool:
        try:
            return part.write(ops, request)
        except (KeyError, TypeError, ValueError) as e:
            raise not_bytes(e, f"ops of partition {part.pid}")

    def compare_and_set_groups(self, groups: list[tuple[int, list[Any]]], request: bytes | None = None) -> list[bool]:
        """A node's ``CompareAndSet``: one [state, key, expected, new] per partition, all checked first, each
        applied once per ``request`` id; answers which set."""
        requests.check_id(request, "compare_and_set")
        for pid, cas in groups:
            check_compare_and_set(cas, self.specs, pid, self.config.max_key_bytes, self.config.max_value_bytes)
        return [self.partition(pid).compare_and_set(*cas, request)  # type: ignore[call-arg]  # cas: the 4 checked above
                for pid, cas in groups]

    def get_many(self, pid: int, state: str, keys: list[bytes]) -> list[bytes | None]:
        return self.partition(pid).get_many(state, keys)

    def get_runs(self, state: str, pids: list[int], counts: list[int], keys: list[bytes]) -> list[bytes | None]:
        """Values of ``keys`` in runs, run i ``counts[i]`` keys of partition ``pids[i]``, in one RocksDB multi-get
        (the partitions share the process's RocksDB and the state's column family): a 5,000-key read at P=1024 is
        ~340 runs of ~5 keys on a node, each a call of its own and a list each way before."""
        parts = list(map(self.partition, pids))
        if len(keys) == 1:
            return parts[0].get_many(state, keys)
        if not parts:
            return []
        prefixes = chain.from_iterable(map(repeat, [part.prefix for part in parts], counts))
        found = parts[0].family(state).get(list(map(operator.add, prefixes, keys)))
        for part in parts:  # one closed meanwhile may have been dropped before the read: no answer from it
            part.check_open()
        return parts[0].live(state, found)

    def scan(self, pid: int, state: str, prefix: bytes = b"", after: bytes | None = None, limit: int | None = None,
             stop: bytes | None = None) -> list[tuple[bytes, bytes]]:
        return self.partition(pid).scan(state, prefix, after, limit, stop)

    def scan_columns(self, pid: int, state: str, prefix: bytes, after: bytes | None, limit: int | None,
                     stop: bytes | None) -> tuple[list[bytes], list[bytes]]:
        """``scan`` as (keys, values)."""
        page = self.partition(pid).scan(state, prefix, after, limit, stop)
        return [key for key, _ in page], [value for _, value in page]

    def stats(self, pids: Iterable[int] | None = None) -> dict:
        """Live entries and bytes per state, and per partition (exact: it reads every entry)."""
        states: dict[str, dict[str, Any]] = {
            name: {"kind": s.kind, "ttl": s.ttl, "keys": 0, "bytes": 0} for name, s in self.specs.items()}
        partitions: dict[int, dict[str, int]] = {}
        for pid in sorted(self._parts if pids is None else pids):
            part = self.partition(pid)
            row = {"keys": 0, "bytes": 0}
            for name in self.specs:
                n, size = part.count(name)
                states[name]["keys"] += n
                states[name]["bytes"] += size
                row["keys"] += n
                row["bytes"] += size
            partitions[pid] = row
        return {"states": states, "partitions": partitions}

    # -- background TTL removal and shutdown -----------------------------

    def _sweep_loop(self) -> None:
        while not self._stop.wait(self.config.ttl_sweep_interval):
            self.sweep_expired()
            self.forget_requests()

    def forget_requests(self, now: float | None = None) -> None:
        """Drop request ids older than ``request_window`` (see store/requests.py)."""
        self._each_owned(lambda part: part.forget_requests(self.config.request_window, now))

    def sweep_expired(self) -> int:
        return sum(self._each_owned(lambda part: part.sweep_expired(name, should_stop=self._stop.is_set))
                   for name, spec in list(self.specs.items()) if spec.ttl is not None)

    def _each_owned(self, work: Callable[[Partition], int | None]) -> int:
        """``work`` on every owned partition, but one closed or moved away meanwhile, or a backup (its primary's
        sweeps reach it as writes); the sum of its answers."""
        total = 0
        for pid in self.owned():
            try:
                part = self.partition(pid)
                total += 0 if part.backup else work(part) or 0
            except (StoreClosedError, PartitionUnavailableError):
                continue
        return total

    def close(self) -> None:
        if self._lock_file is None:
            return
        self._stop.set()
        if self._sweeper is not threading.current_thread():
            self._sweeper.join()
        self._close_parts_and_unlock()

    def _close_parts_and_unlock(self) -> None:
        for pid in list(getattr(self, "_parts", {})):
            self.close_partition(pid)
        if hasattr(self, "_trash"):
            self._trash.close()
        if hasattr(self, "db"):
            self.db.close()
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None


def not_bytes(e: Exception, what: str) -> Exception:
    """rocksdict's error about a key or value that is not bytes, as the ProtocolError it is."""
    if isinstance(e, RockstateError):  # UnknownStateError is a KeyError too
        return e
    return ProtocolError(f"{what}: {e.args[0] if e.args else e}; keys and values are bytes")


def _lock(path: str) -> IO[str]:
    f = open(os.path.join(path, "LOCK"), "a")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise StoreLockedError(f"store at {path} is already open (in this process or another one)") from None
    return f
