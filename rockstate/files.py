"""Small JSON files every layer keeps (a store's catalog, a node's identity, upload records), replaced atomically."""

from __future__ import annotations

import json
import os


def write_json(path: str, data: object, sync: bool = True) -> None:
    """Replace ``path`` atomically: readers see the old file or the new one. ``sync=False`` skips the fsync,
    for a record whose loss in a power failure is harmless (it is rebuilt, or only makes work redone)."""
    tmp = path + ".tmp"
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))  # one C call: json.dump with an indent is pure Python
    with open(tmp, "w") as f:
        f.write(text)
        if sync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: str, default: object = None) -> object:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return default
