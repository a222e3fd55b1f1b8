"""rockstate: distributed RocksDB-backed keyed state for PySpark pipelines."""

__version__ = "0.1.0"  # the package's version (pyproject.toml reads it from here)

from . import errors
from .errors import RockstateError

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


# Everything else is imported when first asked for: a node or coordinator process, or a Spark worker that
# only connects, does not pay at start-up for what it never uses (numpy and pyarrow for column keys; the
# coordinator, its web server and aiohttp for LocalCluster: a quarter of a Spark task's time in a profile).
_LAZY = {
    "connect": "cluster.client.backend", "LocalCluster": "local.cluster", "open": "embedded", "partition_of": "keys",
    "partitions_of": "keys", "register_codec": "codecs", "ListState": "states", "MapState": "states",
    "Rockstate": "api", "ValueState": "states",
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'rockstate' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
