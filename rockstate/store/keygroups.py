"""A process's one RocksDB: every partition it holds as a key group (Flink's layout).

A key of partition ``pid`` is stored as ``prefix(pid) + key`` (4 bytes, big-endian), in a column family per
state shared by all partitions. So the cost of a write, an open or a checkpoint does not depend on how many
partitions a process holds: one WAL, one set of memtables, one MANIFEST (``bench/shared_db.py`` measured the
layouts: at P=271 a DB per partition took 1.08 s to create a node's share, a DB with key groups 0.01 s).

A partition leaves by a range deletion over every family (``drop``), and arrives from a *copy*
(``import_copies``, many partitions at once), which never reaches another partition's keys:

- a move's or a backup's copy, what ``export`` writes: one SST file per state for all the partitions it holds
  (one, or a backup transfer's many), keys with their prefix. Each file is ingested into a scratch RocksDB, which
  shows where its keys are (its first and last, and a seek per gap between its partitions); a key of a
  partition the export was not sent for refuses them all; the files then go in as they are.
- a node's checkpoint (a key-group RocksDB), or a partition folder of the earlier layout and its checkpoints (a
  RocksDB of one partition, keys without a prefix): read within the partition's range and written as SST files
  behind its prefix.

Either way the SST files are ingested after a range deletion of what the partitions held: one ingestion per
state, whatever the number of partitions (their ranges are disjoint).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import threading
import uuid
from collections import deque
from contextlib import nullcontext
from itertools import chain, repeat
from typing import Any, Callable, Iterable, Iterator, Mapping

from rocksdict import AccessType, Checkpoint, IngestExternalFileOptions, Options, Rdict, ReadOptions, SstFileWriter, WriteBatch

from ..errors import ProtocolError
from .catalog import check_name
from .resources import Resources
from .writes import each

_PREFIX = struct.Struct(">I")
PREFIX_BYTES = _PREFIX.size
SST, STATES = ".sst", "states.json"  # an export's files
IMPORTING = "import."  # a folder beside the RocksDB where copies are checked before they go in


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
        parent = os.path.dirname(path)  # the store's folder: an import a crash cut short goes (opened once: none runs)
        for name in os.listdir(parent) if os.path.isdir(parent) else ():
            if name.startswith(IMPORTING):
                shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
        opts = resources.options()
        names = Rdict.list_cf(path, opts) if is_rocksdb(path) else ["default"]
        wanted = [n for n in dict.fromkeys([*names, *states]) if n != "default"]
        self.db = Rdict(path, opts, column_families={n: resources.options() for n in wanted})
        # Any: rocksdict's stubs take a multi-get's keys as an invariant list of scalars, not list[bytes]
        self.families: dict[str, Any] = {n: self.db.get_column_family(n) for n in wanted}
        self.handles = {n: self.db.get_column_family_handle(n) for n in wanted}
        self.kinds: dict[str, tuple[Any, int | None, bool]] = {}  # the partitions' cache (``Partition.state_kind``)
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

    def snapshots(self, pid: int) -> dict[str, tuple[Any, Any, ReadOptions]]:
        """The partition's keys and values in each family, as iterators, for ``export``: taken under the
        partition's lock, they are one cut of its writes (a RocksDB iterator reads as of its creation; rocksdict's
        ``Snapshot`` iterators do not: they read the latest data, which put writes made after a copy's position
        into the copy, and a backup applied them twice)."""
        start, end = bounds(pid)
        read = _upto(end)  # kept with the iterators: they read its bound while they run (freed, it bound nothing)
        return {name: (family.keys(from_key=start, read_opt=read), family.values(from_key=start, read_opt=read), read)
                for name, family in self.families.items()}

    def entries(self, pid: int, limit: int) -> tuple[dict[str, list[list[bytes]]], int] | None:
        """The partition's keys (without its prefix) and values, {state: [keys, values]}, and what they weigh;
        None when they weigh more than ``limit`` (files are then the cheaper copy). Read under the partition's lock,
        they are one cut of its writes."""
        start, end = bounds(pid)
        found: dict[str, list[list[bytes]]] = {}
        size = 0
        for name, family in self.families.items():
            keys: list[bytes] = []
            values: list[bytes] = []
            read = _upto(end)  # held while the iterator runs: freed, it would bound nothing
            for key, value in family.items(from_key=start, read_opt=read):
                if key >= end:  # (the bound already stops it: never another partition's key in a copy)
                    break
                size += len(key) - PREFIX_BYTES + len(value)  # as ``put_entries`` weighs them
                if size > limit:
                    return None
                keys.append(key[PREFIX_BYTES:])
                values.append(value)
            if keys:
                found[name] = [keys, values]
        return found, size

    def put_entries(self, pid: int, entries: object) -> int:
        """``entries`` (``entries``' answer, from another node: checked first, nothing written when anything is
        wrong) added to partition ``pid``, behind its prefix; answers what they weigh."""
        if type(entries) is not dict:
            raise ProtocolError(f"a copy's entries are {{state: [keys, values]}}, not {entries!r:.80}")
        base, size, rows = prefix(pid), 0, []
        for state, pair in entries.items():
            name = check_name(state, "state", internal=True)
            if (type(pair) is not list or len(pair) != 2 or type(pair[0]) is not list or type(pair[1]) is not list
                    or len(pair[0]) != len(pair[1])):
                raise ProtocolError(f"a copy's entries of state {name!r} are [keys, values] of one length, not {pair!r:.80}")
            for key, value in zip(*pair):
                if type(key) is not bytes or type(value) is not bytes:
                    raise ProtocolError(f"a copy's entries of state {name!r} hold a key or value that is not bytes")
                size += len(key) + len(value)
            rows.append((name, pair))
        batch = WriteBatch(raw_mode=True)
        for name, (keys, values) in rows:
            self.ensure(name)
            each(batch.put, [base + key for key in keys], values, repeat(self.handles[name]))
        self.db.write(batch)
        return size

    def export(self, cuts: Mapping[int, dict[str, tuple[Any, Any, ReadOptions]]], target: str) -> None:
        """Partitions as of their ``cuts`` ({pid: ``snapshots(pid)``}), as SST files at ``target`` (``0000.sst``...,
        one per state holding every partition's keys, with their prefix, in order) and ``states.json``, the state
        of each (no RocksDB: ``import_copies`` checks their range and ingests them as they are). A transfer of
        many partitions is a file per state, not per partition."""
        os.makedirs(target)
        states: list[str] = []
        pids = sorted(cuts)
        for name in dict.fromkeys(name for pid in pids for name in cuts[pid]):
            keys = chain.from_iterable(cuts[pid][name][0] for pid in pids if name in cuts[pid])
            values = chain.from_iterable(cuts[pid][name][1] for pid in pids if name in cuts[pid])
            if _write_sst(self._resources.options(), os.path.join(target, f"{len(states):04d}{SST}"), keys, values):
                states.append(name)
        with open(os.path.join(target, STATES), "w") as f:
            json.dump(states, f)

    def import_copies(self, copies: Mapping[int, tuple[str, int | None]], replace: bool = True,
                      locked: Callable[[], Any] | None = None, holds: Mapping[str, Iterable[int]] = {}) -> None:
        """Each partition ``pid`` of ``copies`` becomes the copy at ``copies[pid] = (path, source_pid)``: an
        ``export``'s SST files (of partition ``pid``), the range of ``source_pid`` in a key-group RocksDB (a node's
        checkpoint), or a whole RocksDB of one partition, keys without a prefix (``source_pid`` None: the earlier
        layout). ``replace=False`` adds to what is there (a bulk load). ``locked()``: a context manager held while
        the files go in (the partitions' locks). ``holds[path]``: the partitions an export holds, when more than
        those taken from it (their keys are checked, and left out).

        All in one go, whatever their number: a scratch RocksDB per export checks its files, then one
        range deletion per partition and one ingestion per state (a partition at a time cost a scratch RocksDB per
        file and a memtable flush per partition: 61 % of a joining node's CPU at P=271)."""
        if not copies:
            return
        staging = os.path.join(os.path.dirname(self.path), f"{IMPORTING}{uuid.uuid4().hex}")
        os.makedirs(staging)
        try:
            exports = {pid: path for pid, (path, _) in copies.items() if not is_rocksdb(path)}
            files = _checked(exports, staging, holds)
            by_source: dict[str, dict[int, int | None]] = {}
            for pid, (path, source) in copies.items():
                if pid not in exports:
                    by_source.setdefault(path, {})[pid] = source
            for path, pids in by_source.items():  # a node's checkpoint holds many: opened once
                for name, ssts in self._rewrite(path, pids, staging).items():
                    files.setdefault(name, []).extend(ssts)
            for name in files:
                self.ensure(name)
            with locked() if locked is not None else nullcontext():
                # a partition holding nothing here (a new backup's copy: most of a join's or a leave's) gets no range
                # tombstone: one in a memtable makes the ingestion below flush that memtable first
                for pid in copies if replace else ():
                    if not self.empty(pid):
                        self.drop(pid)
                for name, paths in files.items():  # one ingestion (one memtable flush) per state: their keys are disjoint
                    if paths:
                        self.families[name].ingest_external_file(paths, _moving())
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _rewrite(self, copy: str, pids: dict[int, int | None], staging: str) -> dict[str, list[str]]:
        """The RocksDB at ``copy``: for each ``pid``, the range of ``pids[pid]`` (all of it: None) as SST files
        behind ``pid``'s prefix."""
        opts = self._resources.options()
        opts.create_if_missing(False)
        names = [n for n in Rdict.list_cf(copy, opts) if n != "default"]
        source = Rdict(copy, opts, column_families={n: self._resources.options() for n in names}, access_type=AccessType.read_only())
        try:
            ssts: dict[str, list[str]] = {name: [] for name in names}
            for pid, source_pid in pids.items():
                lo, hi = (b"", None) if source_pid is None else bounds(source_pid)
                again: Callable[[bytes], bytes] | None = None  # keys as they are when the copy's prefix is ours
                if source_pid is None:  # a copy without prefixes: ours in front
                    again = prefix(pid).__add__
                elif source_pid != pid:
                    again = lambda key, base=prefix(pid): base + key[PREFIX_BYTES:]  # noqa: E731
                for name in names:  # within the range only: a copy from outside never reaches another partition's keys
                    family, read = source.get_column_family(name), _upto(hi)  # read: alive while the iterators run
                    keys: Any = family.keys(from_key=lo, read_opt=read)
                    path = os.path.join(staging, f"{name}.{pid}{SST}")
                    if _write_sst(self._resources.options(), path, keys if again is None else map(again, keys),
                                  family.values(from_key=lo, read_opt=read)):
                        ssts[name].append(path)
            return ssts
        finally:
            source.close()

    def checkpoint(self, target: str) -> None:
        Checkpoint(self.db).create_checkpoint(target)

    def close(self) -> None:
        self._resources.memtables(-len(self.families))
        self.families.clear()
        self.handles.clear()
        self.kinds.clear()  # its handles: held, they keep the RocksDB open
        self.db.close()


def _write_sst(opts: Options, path: str, keys: Iterator[bytes], values: Iterator[bytes]) -> bool:
    """``keys`` (in order) with ``values`` as an SST file at ``path``; False (no file) when there are none. The
    rows go in through ``map`` (a C loop: a Python one was the export's main cost)."""
    keys = iter(keys)
    first = next(keys, None)
    if first is None:
        return False
    values = iter(values)
    writer = SstFileWriter(opts)
    writer.open(path)
    writer[first] = next(values)
    deque(map(writer.__setitem__, keys, values), maxlen=0)
    writer.finish()
    return True


def is_rocksdb(path: str) -> bool:
    return os.path.exists(os.path.join(path, "CURRENT"))


def _checked(exports: Mapping[int, str], staging: str, holds: Mapping[str, Iterable[int]] = {}) -> dict[str, list[str]]:
    """Every export's SST files (``exports[pid]``: the export holding partition ``pid``; one may hold several),
    ingested first into a scratch RocksDB per export, which then shows where their keys are: a key of a partition
    the export was not given for refuses them all (a copy from another node never reaches another partition's
    keys). Answers {state: its files, in ``staging``}.

    One scratch RocksDB per export, not per state: each is made and synced on disk, and three of them were most of a
    backup copy's open. Its files go into its one (default) family, one after another: the first and last key of
    each are its own (RocksDB's metadata of the file), and a key found in a gap between the partitions it holds is
    the new file's, the files before it having none there. Only an export holding partitions not taken from it
    (their keys are left out, each file rewritten) needs a family per state, whose keys are the state's alone.
    RocksDB opens a DB's files with up to 16 threads per family, made even for none: one here (a DB made per
    transfer spent more on those threads than on its files)."""
    by_path: dict[str, list[int]] = {}
    for pid, copy in exports.items():
        by_path.setdefault(copy, []).append(pid)
    files: dict[str, list[str]] = {}
    for n, (copy, pids) in enumerate(by_path.items()):
        named: dict[str, str] = {}  # state -> its file in the export
        for i, state in enumerate(_states(copy, pids)):
            name = check_name(state, "state", internal=True)
            if name in named:
                raise ProtocolError(f"the copy of partitions {sorted(pids)[:8]} names state {state!r} twice in {STATES}")
            named[name] = os.path.join(copy, f"{i:04d}{SST}")
        if not named:
            continue
        held, wanted = set(holds.get(copy, pids)), set(pids)
        scratch = os.path.join(staging, f"check.{n}")
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.create_missing_column_families(True)
        opts.set_disable_auto_compactions(True)
        opts.set_max_file_opening_threads(1)
        db = Rdict(scratch, opts, column_families={name: opts for name in named} if held - wanted else None)
        try:
            for name, path in named.items():
                family = db.get_column_family(name) if held - wanted else db
                checked = _check_file(db, family, name, path, held, wanted, f"{scratch}.{name}")
                files.setdefault(name, []).extend([checked] if checked else [])
        finally:
            db.close()
    return files


def _check_file(db: Rdict, family: Rdict, state: str, path: str, holds: set[int], wanted: set[int], taken: str) -> str:
    """The SST file at ``path`` ingested into ``family`` of ``db`` (which holds only files checked before); refused
    unless every key in it is of a partition it ``holds`` (its first and last, and none in a gap between them: a
    seek each). Answers a file of the ``wanted`` partitions' keys: that one, or, when it holds more, a new one of
    theirs at ``taken`` ("": none), read from ``family`` (then the state's own)."""
    before = {f["name"] for f in db.live_files()}
    try:
        family.ingest_external_file([path], _moving())
        [live] = [f for f in db.live_files() if f["name"] not in before]
    except Exception as e:  # noqa: BLE001 -- missing, or not an SST file: RocksDB says which
        raise ProtocolError(f"the copy of partitions {sorted(holds)[:8]}: a file of state {state!r} cannot be "
                            f"read ({e})") from None
    first, last = (_pid_of(live[k]) for k in ("start_key", "end_key"))
    outside = first not in holds or last not in holds
    gap = None
    for pid in range(first, last + 1) if not outside else ():
        if pid not in holds and gap is None:
            gap = pid
        elif pid in holds and gap is not None:  # keys in [gap, pid)?
            found: Any = next(iter(family.keys(from_key=prefix(gap))), None)
            outside, gap = found is not None and found < prefix(pid), None
            if outside:
                break
    if outside:
        raise ProtocolError(f"a copy of partitions {sorted(holds)[:8]} holds keys of another partition "
                            f"(state {state!r}): refused")
    if not holds - wanted:
        return os.path.join(db.path(), live["name"].lstrip("/"))
    reads = [_upto(bounds(pid)[1]) for pid in sorted(wanted)]  # alive while the iterators run
    keys: Any = chain.from_iterable(family.keys(from_key=prefix(pid), read_opt=r) for pid, r in zip(sorted(wanted), reads))
    values: Any = chain.from_iterable(family.values(from_key=prefix(pid), read_opt=r) for pid, r in zip(sorted(wanted), reads))
    taken += SST
    return taken if _write_sst(Options(raw_mode=True), taken, keys, values) else ""


def _pid_of(key: bytes) -> int:
    return _PREFIX.unpack(key[:PREFIX_BYTES])[0] if len(key) >= PREFIX_BYTES else -1


def _states(copy: str, pids: list[int]) -> list:
    """The states an export holds files of, in order (none: partitions never written)."""
    try:
        with open(os.path.join(copy, STATES)) as f:
            states = json.load(f)
    except FileNotFoundError:
        return []
    except ValueError:
        raise ProtocolError(f"the copy of partitions {sorted(pids)[:8]} has no readable {STATES}") from None
    if not isinstance(states, list):
        raise ProtocolError(f"the copy of partitions {sorted(pids)[:8]}: {STATES} is not a list of states")
    return states


def _upto(end: bytes | None) -> ReadOptions:
    read = ReadOptions()
    if end is not None:
        read.set_iterate_upper_bound(end)
    return read


def _moving() -> IngestExternalFileOptions:
    options = IngestExternalFileOptions()
    options.set_move_files(True)
    return options
