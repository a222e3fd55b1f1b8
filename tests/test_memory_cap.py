"""The memory cap with many partitions: what a store's memtables reserve stays within ``memory_bytes``."""

import os

from rockstate.config import StoreConfig
from rockstate.ops import PUT
from rockstate.store import Store

MEMORY = 16 << 20


def test_memtables_of_many_partitions_stay_within_memory_bytes(tmp_path):
    # 64 partitions, each written: every memtable holds data. With RocksDB's default arena block (8 MiB, charged
    # to the cache as each memtable starts) the cache's usage went to 5x its capacity at P=271.
    store = Store(str(tmp_path), StoreConfig(partitions=64, memory_bytes=MEMORY))
    try:
        value = os.urandom(100)
        for pid in range(64):
            store.write(pid, [(PUT, "_requests", f"k{pid}-{i}".encode(), value) for i in range(20)])
        assert store.resources.cache.get_usage() <= MEMORY
    finally:
        store.close()


def _sst_files(path) -> int:
    return sum(name.endswith(".sst") for _, _, names in os.walk(path) for name in names)


def test_memtables_of_many_partitions_are_not_flushed_a_few_keys_at_a_time(tmp_path):
    # Each written memtable holds an arena block however few keys it has. With the write buffers' budget a
    # fixed quarter of memory_bytes, 512 partitions' blocks filled it: every write flushed a memtable of a few
    # keys (an SST file each, and a tenth of the put throughput at P=1024). The budget now counts that floor.
    store = Store(str(tmp_path), StoreConfig(partitions=512, memory_bytes=32 << 20), reserved=["_replication"])
    try:
        value = os.urandom(100)
        for round in range(3):
            for pid in range(512):
                store.write(pid, [(PUT, name, f"k{pid}-{round}-{i}".encode(), value)
                                  for name in ("_requests", "_replication") for i in range(8)])
        assert _sst_files(tmp_path) == 0
        assert store.resources.cache.get_usage() <= 32 << 20
    finally:
        store.close()
    assert store.resources.write_buffers.get_buffer_size() == (32 << 20) // 4  # every family closed: the data's share
