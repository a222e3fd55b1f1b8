"""A dropped partition: its key group deleted by range at once (store/keygroups.py); a partition opened again
starts empty, the others untouched; a format-1 folder (a RocksDB per partition) is imported when its partition
opens and then removed (store/trash.py), also after a crash mid-removal."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest
from rocksdict import Options, Rdict, SstFileWriter

from rockstate.config import StoreConfig
from rockstate.errors import PartitionUnavailableError, ProtocolError
from rockstate.store import PUT, PUT_MANY, StateSpec, Store, keygroups

KEYS = [b"k%05d" % i for i in range(2000)]


def fill(store: Store, pid: int) -> None:
    store.write(pid, [(PUT_MANY, "s", KEYS, [b"v" * 100] * len(KEYS))])
    store.db.flush()  # files on disk, not only the WAL


def test_a_dropped_partition_opened_again_starts_empty(tmp_path):
    store = Store(str(tmp_path / "s"), StoreConfig(partitions=4))
    try:
        store.define_state(StateSpec("s", "value"))
        fill(store, 1)
        for _ in range(3):  # dropped and opened again at once, over and over (a partition moving back)
            fill(store, 2)
            part = store.partition(2)
            store.close_partition(2, drop=True)
            assert store.db.empty(2)
            with pytest.raises(PartitionUnavailableError):  # a user still holding it: nothing lands in a dropped copy
                part.write([(PUT, "s", b"late", b"x")])
            store.open_partition(2)
            assert store.get_many(2, "s", KEYS[:3] + [b"late"]) == [None] * 4
        assert store.get_many(1, "s", [KEYS[0], KEYS[-1]]) == [b"v" * 100] * 2  # the others untouched
        assert store.get_many(3, "s", [KEYS[0]]) == [None]
    finally:
        store.close()


def test_a_partition_not_open_is_dropped_too(tmp_path):
    """A node's partition left from before a restart, moved away meanwhile: not opened, its keys dropped."""
    store = Store(str(tmp_path / "s"), StoreConfig(partitions=4))
    store.define_state(StateSpec("s", "value"))
    fill(store, 3)
    fill(store, 0)
    store.close()
    store = Store(str(tmp_path / "s"), StoreConfig(partitions=4), owned=[0])
    try:
        assert not store.db.empty(3)
        store.drop_all_but({0})
        assert store.db.empty(3) and not store.db.empty(0)
    finally:
        store.close()


def format_1_partition(path: str, pid: int) -> None:
    """A store of format 1's folder of partition ``pid``: its own RocksDB, a column family per state."""
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    db = Rdict(os.path.join(path, f"p{pid:04d}"), opts, column_families={"s": Options(raw_mode=True)})
    for key in KEYS:
        db.get_column_family("s")[key] = b"old"
    db.close()


def test_a_format_1_folder_is_imported_when_its_partition_opens_and_then_removed(tmp_path):
    path = str(tmp_path / "s")
    os.makedirs(path)
    format_1_partition(path, 2)
    store = Store(path, StoreConfig(partitions=4), owned=[])
    try:
        store.define_state(StateSpec("s", "value"))
        assert store.db.empty(2)
        store.open_partition(2)
        assert store.get_many(2, "s", [KEYS[0], KEYS[-1]]) == [b"old", b"old"]
        assert store.scan(2, "s", limit=2) == [(KEYS[0], b"old"), (KEYS[1], b"old")]
        assert store.db.empty(1) and store.db.empty(3)
        store.wait_dropped()
        assert not os.path.exists(os.path.join(path, "p0002")) and os.listdir(os.path.join(path, "trash")) == []
    finally:
        store.close()


CHILD = textwrap.dedent("""
    import sys, threading, time, types
    import rockstate.store.trash as trash
    from rockstate.config import StoreConfig
    from rockstate.store import Store

    never = threading.Event()
    trash.shutil = types.SimpleNamespace(rmtree=lambda *a, **k: never.wait())  # the deletion never ends: the process dies mid-removal
    store = Store(sys.argv[1], StoreConfig(partitions=4))
    print("opened", flush=True)
    time.sleep(600)
""")


def test_the_trash_is_emptied_when_the_store_opens_after_a_crash_mid_removal(tmp_path):
    path = str(tmp_path / "s")
    os.makedirs(path)
    format_1_partition(path, 2)
    child = subprocess.Popen([sys.executable, "-c", CHILD, path], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "opened"
        left = os.listdir(os.path.join(path, "trash"))
        assert len(left) == 1 and left[0].startswith("p0002-")
        assert not os.path.exists(os.path.join(path, "p0002"))
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    assert os.listdir(os.path.join(path, "trash", left[0]))  # its files still there: killed before they went
    store = Store(path, StoreConfig(partitions=4))
    try:
        assert store.get_many(2, "s", [KEYS[0], KEYS[-1]]) == [b"old", b"old"]  # imported before the folder went
        store.wait_dropped()
        assert os.listdir(os.path.join(path, "trash")) == []
    finally:
        store.close()
    shutil.rmtree(path)


def test_a_copy_holding_another_partitions_keys_is_refused_and_changes_nothing(tmp_path):
    """A move's or a backup's copy comes from another node: its SST files' key range is checked before they go in."""
    store = Store(str(tmp_path / "s"), StoreConfig(partitions=4))
    other = Store(str(tmp_path / "o"), StoreConfig(partitions=4))
    try:
        for s in (store, other):
            s.define_state(StateSpec("s", "value"))
        fill(store, 1)
        store.write(2, [(PUT, "s", b"mine", b"kept")])
        other.write(1, [(PUT, "s", b"k00000", b"planted")])
        other.partition(1).export_copy(str(tmp_path / "copy"))  # partition 1's keys, offered as partition 2's
        with pytest.raises(ProtocolError, match="keys of another partition"):
            store.replace_partitions({2: (str(tmp_path / "copy"), 2)})
        other.partition(1).export_copy(str(tmp_path / "good"))
        other.partition(1).export_copy(str(tmp_path / "copy2"))  # (a refused copy's files are used up)
        # in a batch (a join's transfer) beside partition 1's own copy: both claim partition 1's range, all refused
        with pytest.raises(ProtocolError, match="keys of another partition"):
            store.replace_partitions({1: (str(tmp_path / "good"), 1), 2: (str(tmp_path / "copy2"), 2)})
        store.open_partitions([1, 2])  # closed for the copies that failed: what they held is still there
        assert store.get_many(1, "s", [KEYS[0], KEYS[1]]) == [b"v" * 100, b"v" * 100]
        assert store.get_many(2, "s", [b"mine"]) == [b"kept"]
        shutil.rmtree(tmp_path / "good")
        other.partition(1).export_copy(str(tmp_path / "good"))
        os.rename(tmp_path / "good" / "0000.sst", tmp_path / "good" / "x")  # a file its states.json names is missing
        with pytest.raises(ProtocolError, match="cannot be read"):
            store.replace_partitions({1: (str(tmp_path / "good"), 1)})
        store.open_partition(1)
        assert store.get_many(1, "s", [KEYS[0]]) == [b"v" * 100]
        shutil.rmtree(tmp_path / "good")
        other.partition(1).export_copy(str(tmp_path / "good"))
        store.replace_partitions({1: (str(tmp_path / "good"), 1)})  # the same copy as partition 1's: taken whole
        assert store.get_many(1, "s", [KEYS[0], KEYS[1]]) == [b"planted", None]
    finally:
        store.close()
        other.close()


def test_an_export_of_several_partitions_gives_only_those_taken_and_is_checked_against_all_it_holds(tmp_path):
    """A backup's transfer is one export of many partitions; one dropped meanwhile is left out of it."""
    store = Store(str(tmp_path / "s"), StoreConfig(partitions=8))
    other = Store(str(tmp_path / "o"), StoreConfig(partitions=8))
    try:
        for s in (store, other):
            s.define_state(StateSpec("s", "value"))
        for pid in (1, 2, 5):
            other.write(pid, [(PUT, "s", b"k", b"copied %d" % pid)])
            store.write(pid, [(PUT, "s", b"k", b"mine %d" % pid)])
        cuts = {pid: other.partition(pid).cut()[1] for pid in (1, 2, 5)}
        other.db.export(cuts, str(tmp_path / "group"))
        assert len(os.listdir(tmp_path / "group")) == 2  # one SST for the state, and states.json
        shutil.copytree(tmp_path / "group", tmp_path / "group2")
        store.replace_partitions({1: (str(tmp_path / "group"), 1), 5: (str(tmp_path / "group"), 5)},
                                 holds={str(tmp_path / "group"): [1, 2, 5]})
        got = [store.get_many(pid, "s", [b"k"])[0] for pid in (1, 2, 5)]
        assert got == [b"copied 1", b"mine 2", b"copied 5"]  # partition 2, not taken, kept what it held
        with pytest.raises(ProtocolError, match="keys of another partition"):  # given as holding 1 and 5 alone
            store.replace_partitions({1: (str(tmp_path / "group2"), 1), 5: (str(tmp_path / "group2"), 5)})
    finally:
        store.close()
        other.close()


def _export(path, files: dict[str, dict[int, list[bytes]]]) -> str:
    """An export as a peer would send it: a file per state (``files[state][pid]``: its keys), and states.json."""
    os.makedirs(path)
    for i, (state, keys) in enumerate(files.items()):
        writer = SstFileWriter(options=Options(raw_mode=True))
        writer.open(os.path.join(path, f"{i:04d}.sst"))
        for pid in sorted(keys):
            for key in sorted(keys[pid]):
                writer[keygroups.prefix(pid) + key] = state.encode() + key
        writer.finish()
    with open(os.path.join(path, "states.json"), "w") as f:
        json.dump(list(files), f)
    return str(path)


def test_a_copys_files_are_each_checked_though_their_states_keys_overlap(tmp_path):
    """The files of a copy's states are checked one after another in one scratch RocksDB: each state's keys of the
    same partitions overlap the others', and a key of a partition not held is found in whichever file holds it."""
    store = Store(str(tmp_path / "s"), StoreConfig(partitions=8))
    try:
        for state in ("a", "b", "c"):
            store.define_state(StateSpec(state, "value"))
        keys = [b"k1", b"k2"]
        good = _export(tmp_path / "good", {"a": {1: keys, 3: keys}, "b": {1: keys, 3: keys}, "c": {3: keys}})
        store.replace_partitions({1: (good, 1), 3: (good, 3)})
        assert [store.get_many(pid, state, keys) for pid, state in ((1, "a"), (3, "b"), (3, "c"), (1, "c"))] == [
            [b"ak1", b"ak2"], [b"bk1", b"bk2"], [b"ck1", b"ck2"], [None, None]]
        for n, bad in enumerate(({"a": {1: keys, 3: keys}, "b": {1: keys, 2: keys, 3: keys}},  # the second state's file, in the gap
                                 {"a": {1: keys, 3: keys}, "b": {1: keys}, "c": {3: keys, 4: keys}},  # the third's, past the last
                                 {"a": {1: keys, 2: [b"x"], 3: keys}, "b": {1: keys, 3: keys}})):  # the first's, a key the others lack
            copy = _export(tmp_path / f"bad{n}", bad)
            with pytest.raises(ProtocolError, match="keys of another partition"):
                store.replace_partitions({1: (copy, 1), 3: (copy, 3)})
            store.open_partitions([1, 3])
            assert store.get_many(3, "b", keys) == [b"bk1", b"bk2"]  # what the good copy left, untouched
    finally:
        store.close()


def test_a_copy_holds_exactly_the_writes_before_it_and_a_move_records_the_rest(tmp_path):
    """The copy's cut is taken under the partition's lock; it is written out after, while writes go on: none of
    those may be in it (a backup would apply them again from the stream: an append twice)."""
    store = Store(str(tmp_path / "s"), StoreConfig(partitions=4))
    other = Store(str(tmp_path / "o"), StoreConfig(partitions=4), owned=[])
    try:
        store.define_state(StateSpec("s", "value"))
        fill(store, 1)
        part = store.partition(1)
        with part.lock:  # the copy's cut, as export_copy takes it
            cut = part.node_db.snapshots(1)
        store.write(1, [(PUT_MANY, "s", KEYS[:10], [b"after"] * 10), (PUT, "s", b"new", b"after")])
        store.db.flush()
        part.node_db.export({1: cut}, str(tmp_path / "copy"))
        other.replace_partitions({1: (str(tmp_path / "copy"), 1)}, {"s": {"name": "s", "kind": "value"}})
        assert other.get_many(1, "s", [KEYS[0], KEYS[-1], b"new"]) == [b"v" * 100, b"v" * 100, None]
        assert store.scan(1, "s", limit=1) == [(KEYS[0], b"after")]
    finally:
        store.close()
        other.close()


def test_an_import_a_crash_cut_short_is_removed_when_the_store_opens(tmp_path):
    path = str(tmp_path / "s")
    Store(path, StoreConfig(partitions=4)).close()
    left = os.path.join(path, "import.0123abcd")
    os.makedirs(os.path.join(left, "check.0.0"))  # a scratch RocksDB's folder, as a killed process leaves it
    store = Store(path, StoreConfig(partitions=4))
    try:
        assert not os.path.exists(left)
    finally:
        store.close()


def test_a_copy_into_a_partition_holding_nothing_here_flushes_no_memtable_and_one_holding_keys_replaces_them(tmp_path):
    """A new backup's copy (the partition holds nothing on this node) goes in without a range tombstone, so its
    ingestion leaves the memtable of the other partitions' writes in place; a copy over a partition holding keys
    drops them first (a key the copy lacks is gone)."""
    store = Store(str(tmp_path / "s"), StoreConfig(partitions=8))
    other = Store(str(tmp_path / "o"), StoreConfig(partitions=8))
    try:
        for s in (store, other):
            s.define_state(StateSpec("s", "value"))
        for pid in (3, 6):
            other.write(pid, [(PUT, "s", b"order-1", b"copied %d" % pid)])
        other.db.export({3: other.partition(3).cut()[1]}, str(tmp_path / "new"))
        other.db.export({6: other.partition(6).cut()[1]}, str(tmp_path / "over"))
        store.write(6, [(PUT, "s", b"order-0", b"old"), (PUT, "s", b"order-1", b"old")])
        store.db.flush()
        store.write(0, [(PUT, "s", b"unflushed", b"x")])  # another partition's write, in the memtable only
        in_memtable = store.db.families["s"].property_int_value("rocksdb.num-entries-active-mem-table")
        assert in_memtable == 1
        store.replace_partitions({3: (str(tmp_path / "new"), 3)})
        assert store.get_many(3, "s", [b"order-1"]) == [b"copied 3"]
        assert store.db.families["s"].property_int_value("rocksdb.num-entries-active-mem-table") == in_memtable
        store.replace_partitions({6: (str(tmp_path / "over"), 6)})
        assert store.get_many(6, "s", [b"order-0", b"order-1"]) == [None, b"copied 6"]
        assert store.get_many(0, "s", [b"unflushed"]) == [b"x"]
    finally:
        store.close()
        other.close()
