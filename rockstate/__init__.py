"""rockstate: distributed RocksDB-backed keyed state for PySpark pipelines."""

__version__ = "0.1.0"  # the package's version (pyproject.toml reads it from here)

from . import errors
from .api import Rockstate
from .cluster.client import connect
from .codecs import register_codec
from .cluster.local import LocalCluster
from .embedded import open
from .errors import RockstateError
from .keys import partition_of, partitions_of
from .states import ListState, MapState, ValueState

__all__ = [
    "__version__",
    "connect",
    "LocalCluster",
    "errors",
    "open",
    "partition_of",
    "partitions_of",
    "register_codec",
    "ListState",
    "MapState",
    "Rockstate",
    "RockstateError",
    "ValueState",
]
