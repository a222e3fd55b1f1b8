"""Savepoints: a self-contained copy of one completed checkpoint, made by the storage itself.

``savepoints/<name>/`` mirrors the cluster's layout — ``chk-N/_metadata``,
``chk-N/p0042.json``, ``chk-N/p0042/...``, ``shared/p0042/...`` — so the
manifests are copied unchanged and their paths resolve against the
savepoint's folder. Every file is copied with the storage's server-side copy
(S3 CopyObject: the bytes never leave the store), in parallel; the
``_savepoint`` marker is written last and makes the savepoint exist. Nothing
in a savepoint is ever deleted by checkpoint garbage collection, and no
checkpoint references a savepoint's files.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from ..errors import CheckpointNotFoundError, CorruptCheckpointError, SavepointExistsError
from ..store.catalog import check_name
from .manifest import CheckpointMetadata, canonical_json
from .restore import load_manifests, load_metadata
from .storage import CheckpointStorage, join, metadata_path, savepoint_dir

MARKER = "_savepoint"


@dataclass
class SavepointInfo:
    name: str
    checkpoint_id: int
    created_at: float
    size: int
    files: int
    seconds: float = 0.0
    path: str = ""

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def create_savepoint(storage: CheckpointStorage, name: str, checkpoint_id: int) -> SavepointInfo:
    """Copy completed checkpoint ``checkpoint_id`` to ``savepoints/<name>``. Refuses an existing name."""
    check_name(name, "savepoint")
    start = time.perf_counter()
    base = savepoint_dir(name)
    if storage.exists(join(base, MARKER)):
        raise SavepointExistsError(f"savepoint {name!r} exists already in {storage.url}", name=name)
    meta = load_metadata(storage, checkpoint_id)
    manifests = load_manifests(storage, meta)
    files = sorted({f.path for m in manifests.values() for f in m.files} | {r.path for r in meta.manifests})
    files.append(metadata_path(checkpoint_id))  # last: the copy is complete once it is there
    storage.delete_tree(base)  # an earlier attempt that did not finish
    storage.parallel(lambda rel: storage.copy(rel, join(base, rel)), files[:-1])
    storage.copy(files[-1], join(base, files[-1]))
    info = SavepointInfo(name, checkpoint_id, time.time(), meta.size, len(files), time.perf_counter() - start, f"{storage.url}/{storage.cluster}/{base}")
    storage.write_bytes(join(base, MARKER), canonical_json(info.to_dict()))
    return info


def read_savepoint(storage: CheckpointStorage, name: str) -> tuple[SavepointInfo, CheckpointMetadata, str]:
    """(info, metadata, base folder) of savepoint ``name``."""
    check_name(name, "savepoint")
    base = savepoint_dir(name)
    try:
        data = storage.read_bytes(join(base, MARKER))
    except CorruptCheckpointError:
        raise CheckpointNotFoundError(f"no savepoint {name!r} in {storage.url}/{storage.cluster}", name=name) from None
    try:
        info = SavepointInfo(**json.loads(data))
    except (ValueError, TypeError) as exc:
        raise CorruptCheckpointError(f"savepoint {name!r}: unreadable {MARKER}: {exc}", name=name) from None
    return info, load_metadata(storage, info.checkpoint_id, base), base


def list_savepoints(storage: CheckpointStorage) -> list[SavepointInfo]:
    out = []
    for name in storage.savepoint_names():
        try:
            out.append(SavepointInfo(**json.loads(storage.read_bytes(join(savepoint_dir(name), MARKER)))))
        except (CorruptCheckpointError, ValueError, TypeError):
            continue
    return out


def delete_savepoint(storage: CheckpointStorage, name: str) -> None:
    check_name(name, "savepoint")
    storage.delete([join(savepoint_dir(name), MARKER)])  # first: a half-deleted savepoint is never used
    storage.delete_tree(savepoint_dir(name))
