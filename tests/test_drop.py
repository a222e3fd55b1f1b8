"""A dropped partition (store/trash.py): out of its place at once, closed and deleted in the background; a
partition opened again starts empty; what a process killed mid-drop left in the trash goes when the store opens."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from rockstate.config import StoreConfig
from rockstate.errors import PartitionUnavailableError
from rockstate.store import PUT, PUT_MANY, StateSpec, Store

KEYS = [b"k%05d" % i for i in range(2000)]


def fill(store: Store, pid: int) -> None:
    store.write(pid, [(PUT_MANY, "s", KEYS, [b"v" * 100] * len(KEYS))])
    store.partition(pid).flush()  # files on disk, not only the WAL


def test_a_dropped_partition_opened_again_starts_empty(tmp_path):
    store = Store(str(tmp_path / "s"), StoreConfig(partitions=4))
    try:
        store.define_state(StateSpec("s", "value"))
        for _ in range(3):  # dropped and opened again at once, over and over (a partition moving back)
            fill(store, 2)
            part = store.partition(2)
            store.close_partition(2, drop=True)
            assert not os.path.exists(store.partition_path(2))
            with pytest.raises(PartitionUnavailableError):  # a user still holding it: nothing lands in a dropped copy
                part.write([(PUT, "s", b"late", b"x")])
            store.open_partition(2)
            assert store.get_many(2, "s", KEYS[:3] + [b"late"]) == [None] * 4
        assert store.get_many(1, "s", [b"k00000"]) == [None]
        fill(store, 1)  # the others untouched
        store.wait_dropped()
        assert os.listdir(os.path.join(store.path, "trash")) == []
        assert store.get_many(1, "s", [b"k00000"]) == [b"v" * 100]
    finally:
        store.close()


def test_a_partition_not_open_is_dropped_too(tmp_path):
    """A node's partition left from before a restart, moved away meanwhile: not opened, its folder dropped."""
    store = Store(str(tmp_path / "s"), StoreConfig(partitions=4))
    store.define_state(StateSpec("s", "value"))
    fill(store, 3)
    store.close()
    store = Store(str(tmp_path / "s"), StoreConfig(partitions=4), owned=[0])
    try:
        assert os.path.exists(store.partition_path(3))
        store.close_partition(3, drop=True)
        assert not os.path.exists(store.partition_path(3))
        store.wait_dropped()
        assert os.listdir(os.path.join(store.path, "trash")) == []
    finally:
        store.close()


CHILD = textwrap.dedent("""
    import sys, threading, time
    import rockstate.store.trash as trash
    from rockstate.config import StoreConfig
    from rockstate.store import PUT_MANY, StateSpec, Store

    never = threading.Event()
    trash.shutil.rmtree = lambda *a, **k: never.wait()  # the deletion never ends: the process dies mid-drop
    store = Store(sys.argv[1], StoreConfig(partitions=4))
    store.define_state(StateSpec("s", "value"))
    store.write(2, [(PUT_MANY, "s", [b"k%05d" % i for i in range(2000)], [b"v" * 100] * 2000)])
    store.partition(2).flush()
    store.close_partition(2, drop=True)
    print("dropped", flush=True)
    time.sleep(600)
""")


def test_the_trash_is_emptied_when_the_store_opens_after_a_crash_mid_drop(tmp_path):
    path = str(tmp_path / "s")
    child = subprocess.Popen([sys.executable, "-c", CHILD, path], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "dropped"
        left = os.listdir(os.path.join(path, "trash"))
        assert len(left) == 1 and left[0].startswith("p0002-")
        assert not os.path.exists(os.path.join(path, "p0002"))
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    assert os.listdir(os.path.join(path, "trash", left[0]))  # its files still there: killed before they went
    store = Store(path, StoreConfig(partitions=4))  # opens every partition: 2 again, empty
    try:
        assert store.get_many(2, "s", [b"k00000", b"k01999"]) == [None, None]
        store.wait_dropped()
        assert os.listdir(os.path.join(path, "trash")) == []
    finally:
        store.close()
