"""One process's partitions: a RocksDB instance per partition, sharing memory.

Directory layout::

    <path>/LOCK           flock: one process opens a store at a time
    <path>/STORE.json     {"partitions": P}: fixed when the store is created
    <path>/states.json    the catalog: name -> kind, ttl
    <path>/p0042/         partition 42's RocksDB
    <path>/trash/         dropped or replaced partitions' directories, deleted in the background (trash.py)
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from concurrent.futures import Future
from typing import IO, Any, Callable, Iterable, cast

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
from .checks import check_compare_and_set, check_ops
from .partition import Partition
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
            self._mutex = threading.Lock()
            self._opening: dict[int, threading.Lock] = {}  # pid -> held while its RocksDB opens
            self._trash = Trash(self.path)
            self._dropping: dict[int, Future] = {}  # pid -> its dropped RocksDB's close, in the background
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
        if meta is None:
            write_json(meta_path, {"partitions": self.partitions, "format": 1})
        elif meta["partitions"] != self.partitions:
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
            parts = list(self._parts.values())
        _one_at_a_time(lambda part: part.ensure_state(spec.name), parts)
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
        self.check_pid(pid)
        with self._mutex:
            part = self._parts.get(pid)
            if part is not None:
                return part
            opening = self._opening.setdefault(pid, threading.Lock())
        with opening:  # the RocksDB open outside the store's mutex: other partitions open meanwhile
            with self._mutex:
                part = self._parts.get(pid)
                if part is not None:
                    return part
                states = [*self.specs, *self.reserved]
                dropping = self._dropping.pop(pid, None)
            if dropping is not None:  # the copy dropped before: closed first, its background work is on this path
                dropping.exception()
            try:
                # every state's column family opened (created) with the DB: one MANIFEST sync, not one per state
                part = Partition(pid, self.partition_path(pid), self.resources, self.specs, states)
                with self._mutex:
                    self._parts[pid] = part
            finally:
                with self._mutex:
                    self._opening.pop(pid, None)
        for name in list(self.specs):  # one defined while it opened (define_state did not see it yet)
            part.ensure_state(name)
        return part

    def open_partitions(self, pids: Iterable[int]) -> list[Partition]:
        """``open_partition`` of each, one at a time (``_one_at_a_time``: a RocksDB open holds the GIL)."""
        return _one_at_a_time(self.open_partition, list(pids))

    def close_partition(self, pid: int, drop: bool = False) -> None:
        """``drop``: its directory too, open or not, at once out of the way (into the trash): a partition opened
        here again starts empty. Its RocksDB closes and its files go in the background: cheap on an event loop."""
        with self._mutex:
            opening = self._opening.get(pid)
        if opening is not None:
            with opening:  # an open in flight ends first: then it is closed
                pass
        with self._mutex:
            part = self._parts.pop(pid, None)
        if not drop:
            if part is not None:
                part.close()
            return
        db = None if part is None else part.detach()  # unusable now: no write lands in a dropped copy
        with self._mutex:  # an open of it again waits for this close (open_partition)
            self._dropping[pid] = self._trash.discard(self.partition_path(pid), None if db is None else db.close)

    def wait_dropped(self) -> None:
        """Until every partition dropped so far is closed and its files deleted."""
        self._trash.wait()

    def replace_partitions(self, dirs: dict[int, str], states: dict[str, dict] | None = None) -> None:
        """Each partition's directory becomes ``dirs[pid]`` (a restored or moved-in copy), and is opened.

        Restore, failover and moves all end here. ``states``: the copy's catalog
        (a checkpoint's), merged into this store's before the partitions open.
        Renames only: each partition directory is either the old one or the new one.
        """
        for pid in dirs:
            self.close_partition(self.check_pid(pid))
        for pid, new in dirs.items():  # per partition: moves of other partitions may be doing the same meanwhile
            self._trash.discard(self.partition_path(pid))
            os.rename(new, self.partition_path(pid))
        if states:
            with self._mutex:  # the specs dict is shared with the open partitions: update it in place
                self.specs.update({name: StateSpec.from_dict(data) for name, data in states.items()})
                write_json(self._catalog_path, {n: s.to_dict() for n, s in self.specs.items()})
        self.open_partitions(dirs)

    # -- operations (the node serves these per partition) ----------------

    def write(self, pid: int, ops: list, request: bytes | None = None) -> bool:
        """Apply ``ops`` to partition ``pid`` once per ``request`` id; answers whether they applied now."""
        return self.partition(pid).write(ops, request)

    def check_ops(self, groups: list) -> None:
        """Every group's ops, as received over the wire: shape, states, and the key and value size limits."""
        for pid, ops in groups:
            check_ops(ops, self.specs, f"partition {pid}", self.config.max_key_bytes, self.config.max_value_bytes)

    def write_groups(self, groups: list, request: bytes | None = None) -> list[bool]:
        """A node's ``Write``: every group's ops checked before any applies, then each group applied (atomically,
        once per ``request`` id) to its partition; answers which applied now."""
        requests.check_id(request, "write")
        self.check_ops(groups)
        applied = []
        for pid, ops in groups:
            try:
                applied.append(self.partition(pid).write(ops, request))
            except (KeyError, TypeError, ValueError) as e:
                raise not_bytes(e, f"ops of partition {pid}")
        return applied

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
            self._trash.close()  # every dropped RocksDB closed before the lock goes
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None


def _one_at_a_time(work: Callable[[Any], Any], items: list) -> list:
    """``work`` on each item in turn, the GIL let go between two. rocksdict holds the GIL through a RocksDB open
    and a column family's creation, file syncs included: threads did not overlap them (48 opens took 1.4 s with 1
    to 8 threads), and an event loop beside them waited for several (its worst lag 0.09 s with one, 0.24-0.44 s
    with 2 to 8, on a loaded 2-core machine)."""
    answers = []
    for item in items:
        answers.append(work(item))
        time.sleep(0)  # the GIL to a waiting thread (a node's event loop) now, not after its switch interval
    return answers


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
