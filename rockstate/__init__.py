"""rockstate: distributed RocksDB-backed keyed state for PySpark pipelines."""

__version__ = "0.1.0"  # the package's version (pyproject.toml reads it from here)

from . import errors
from .api import Rockstate
from .cluster.client import connect
from .codecs import register_codec
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


def __getattr__(name: str):
    # LocalCluster brings the coordinator, its web server and aiohttp: imported when asked for, so a Spark
    # worker that only connects does not pay for them at start-up (a quarter of its task time in a profile)
    if name == "LocalCluster":
        from .cluster.local import LocalCluster

        return LocalCluster
    raise AttributeError(f"module 'rockstate' has no attribute {name!r}")
