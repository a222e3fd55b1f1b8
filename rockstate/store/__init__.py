"""One process's partitions: RocksDB per partition, states, TTL."""

from .catalog import KINDS, StateSpec, check_name
from .partition import APPEND, DELETE, DELETE_PREFIX, PUT, Partition, Resources
from .store import Store

__all__ = ["KINDS", "StateSpec", "check_name", "APPEND", "DELETE", "DELETE_PREFIX", "PUT", "Partition", "Resources", "Store"]
