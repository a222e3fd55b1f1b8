"""One process's partitions: key groups of one RocksDB, states, TTL, staged transactions."""

from ..ops import APPEND, DELETE, DELETE_MANY, DELETE_PREFIX, PUT, PUT_MANY
from .catalog import KINDS, StateSpec, check_name
from .partition import Partition
from .resources import Resources
from .store import Store

__all__ = [
    "KINDS", "StateSpec", "check_name",
    "APPEND", "DELETE", "DELETE_MANY", "DELETE_PREFIX", "PUT", "PUT_MANY",
    "Partition", "Resources", "Store",
]
