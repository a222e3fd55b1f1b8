"""A process's one RocksDB: every partition it holds as a key group (Flink's layout).

A key of partition ``pid`` is stored as ``prefix(pid) + key`` (4 bytes, big-endian), in a column family per
state shared by all partitions. So the cost of a write, an open or a checkpoint does not depend on how many
partitions a process holds: one WAL, one set of memtables, one MANIFEST (``bench/shared_db.py`` measured the
layouts: at P=271 a DB per partition took 1.08 s to create a node's share, a DB with key groups 0.01 s).

A partition leaves by a range deletion over every family (``drop``), and arrives from a *copy*: a
standalone RocksDB of that partition alone, keys without the prefix, a column family per state -- what
``export`` writes and what a move, a backup copy or an older checkpoint holds -- or from a key-group
RocksDB (a node's checkpoint) by its range (``source_pid``). ``import_copies`` reads the copy within that
range only, so a copy from outside cannot reach another partition's keys, writes the range as SST files
and ingests them after deleting what the partition held.
"""

from __future__ import annotations

import os
import shutil
import struct
import threading
from contextlib import nullcontext
from itertools import islice
from typing import Any, Callable, Iterable, Iterator

from rocksdict import AccessType, Checkpoint, IngestExternalFileOptions, Options, Rdict, ReadOptions, SstFileWriter

from .resources import Resources

_PREFIX = struct.Struct(">I")
PREFIX_BYTES = _PREFIX.size


def prefix(pid: int) -> bytes:
    return _PREFIX.pack(pid)


def bounds(pid: int) -> tuple[bytes, bytes]:
    """Every key of partition ``pid`` lies in [start, end)."""
    return _PREFIX.pack(pid), _PREFIX.pack(pid + 1)


class NodeDB:
    """The one RocksDB of a store: its column families (a state each) and the partitions' ranges in them."""

    def __init__(self, path: str, resources: Resources, states: Iterable[str] = ()) -> None:
        self.path = path
        self._resources = resources
        self._mutex = threading.Lock()
        opts = resources.options()
        names = Rdict.list_cf(path, opts) if os.path.exists(os.path.join(path, "CURRENT")) else ["default"]
        wanted = [n for n in dict.fromkeys([*names, *states]) if n != "default"]
        self.db = Rdict(path, opts, column_families={n: resources.options() for n in wanted})
        # Any: rocksdict's stubs take a multi-get's keys as an invariant list of scalars, not list[bytes]
        self.families: dict[str, Any] = {n: self.db.get_column_family(n) for n in wanted}
        self.handles = {n: self.db.get_column_family_handle(n) for n in wanted}
        resources.memtables(len(wanted))

    def ensure(self, name: str) -> None:
        """The state's column family, created if missing (shared by every partition)."""
        if name in self.families:
            return
        with self._mutex:
            if name not in self.families:
                family = self.db.create_column_family(name, self._resources.options())
                self.handles[name] = self.db.get_column_family_handle(name)
                self.families[name] = family
                self._resources.memtables(1)

    def flush(self) -> None:
        for family in [self.db, *self.families.values()]:
            family.flush()

    def drop(self, pid: int) -> None:
        """Every key of the partition, in every family, deleted (a range tombstone each: instant)."""
        start, end = bounds(pid)
        for family in self.families.values():
            family.delete_range(start, end)

    def empty(self, pid: int) -> bool:
        start, end = bounds(pid)
        for family in self.families.values():
            read = ReadOptions()
            read.set_iterate_upper_bound(end)
            if next(iter(family.keys(from_key=start, read_opt=read)), None) is not None:
                return False
        return True

    # -- copies --------------------------------------------------------------------

    def snapshots(self, pid: int) -> dict[str, Any]:
        """A snapshot of each family, for ``export`` (taken under the partition's lock: one cut of its writes)."""
        return {name: family.snapshot() for name, family in self.families.items()}

    def export(self, pid: int, snapshots: dict[str, Any], target: str) -> None:
        """The partition as of ``snapshots``, as a standalone RocksDB at ``target`` (keys without the prefix)."""
        start, end = bounds(pid)
        os.makedirs(target)
        ssts = {}
        for name, snap in snapshots.items():
            read = ReadOptions()
            read.set_iterate_upper_bound(end)
            path = os.path.join(target, f"import-{name}.sst")
            if _write_sst(self._resources.options(), path, ((k[PREFIX_BYTES:], v) for k, v in snap.items(from_key=start, read_opt=read))):
                ssts[name] = path
        copy = Rdict(target, self._resources.options(), column_families={n: self._resources.options() for n in snapshots})
        try:
            for name, path in ssts.items():
                copy.get_column_family(name).ingest_external_file([path], _moving())
        finally:
            copy.close()

    def import_copy(self, pid: int, copy: str, source_pid: int | None = None,
                    replace: bool = True, locked: Callable[[], Any] | None = None) -> list[str]:
        """Partition ``pid`` becomes what the RocksDB at ``copy`` holds: all of it, or with ``source_pid`` the range
        of that partition in a key-group RocksDB. ``replace=False`` adds to what is there (a bulk load).
        ``locked()``: a context manager held while the SSTs go in (the partition's lock). Answers the copy's states."""
        if not os.path.exists(os.path.join(copy, "CURRENT")):  # a copy of a partition never written: no files
            with locked() if locked is not None else nullcontext():
                if replace:
                    self.drop(pid)
            return []
        opts = self._resources.options()
        opts.create_if_missing(False)
        source = Rdict(copy, opts, column_families={n: self._resources.options() for n in Rdict.list_cf(copy, opts) if n != "default"},
                       access_type=AccessType.read_only())
        try:
            names = [n for n in Rdict.list_cf(copy, opts) if n != "default"]
            lo, hi = (b"", None) if source_pid is None else bounds(source_pid)
            base = prefix(pid)
            staging = copy.rstrip("/") + ".import"
            shutil.rmtree(staging, ignore_errors=True)
            os.makedirs(staging)
            ssts: dict[str, str] = {}
            cut = len(lo)
            for name in names:
                read = ReadOptions()
                if hi is not None:
                    read.set_iterate_upper_bound(hi)
                rows: Any = source.get_column_family(name).items(from_key=lo, read_opt=read)
                path = os.path.join(staging, f"{name}.sst")
                if _write_sst(self._resources.options(), path, ((base + k[cut:], v) for k, v in rows)):
                    ssts[name] = path
        finally:
            source.close()
        try:
            for name in names:
                self.ensure(name)
            with locked() if locked is not None else nullcontext():
                if replace:
                    self.drop(pid)
                for name, path in ssts.items():
                    self.families[name].ingest_external_file([path], _moving())
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return names

    def checkpoint(self, target: str) -> None:
        Checkpoint(self.db).create_checkpoint(target)

    def close(self) -> None:
        self._resources.memtables(-len(self.families))
        self.families.clear()
        self.handles.clear()
        self.db.close()


def _write_sst(opts: Options, path: str, rows: Iterator[tuple[bytes, bytes]] | Any) -> bool:
    """``rows`` (in key order) as an SST file at ``path``; False (no file) when there are none."""
    rows = iter(rows)
    first = list(islice(rows, 1))
    if not first:
        return False
    writer = SstFileWriter(opts)
    writer.open(path)
    for key, value in first:
        writer[key] = value
    for key, value in rows:
        writer[key] = value
    writer.finish()
    return True


def _moving() -> IngestExternalFileOptions:
    options = IngestExternalFileOptions()
    options.set_move_files(True)
    return options
