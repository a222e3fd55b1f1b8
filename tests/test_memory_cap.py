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
