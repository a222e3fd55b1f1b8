"""Checkpoint storage: the external layout over any fsspec URL.

::

    <root>/<cluster>/shared/<owner>/<sst-stem>-<uuid>.sst  immutable, shared by checkpoints
    <root>/<cluster>/chk-000123/<owner>.json               the manifests of the owner's partitions, one group
    <root>/<cluster>/chk-000123/p0042.json                 a partition's manifest (format 1)
    <root>/<cluster>/chk-000123/<owner>/<file>             the owner's private files (MANIFEST, CURRENT, OPTIONS)

``<owner>``: the store whose RocksDB the files are (``s`` and its id; a format-1 checkpoint's: ``p0042``).
    <root>/<cluster>/chk-000123/_metadata                  written last: checkpoint 123 exists
    <root>/<cluster>/savepoints/<name>/...                 the same layout, copied server-side
    <root>/<cluster>/savepoints/<name>/_savepoint          written last: the savepoint exists

``file://`` and ``s3://`` are tested (S3 through moto's server); ``hdfs://``,
``oss://``, ``gs://``... work through fsspec's implementations when they are
installed. S3 settings come from the standard AWS environment variables
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_DEFAULT_REGION``) or ``storage_options`` (passed to the filesystem).

Every method takes paths relative to ``<root>/<cluster>``. Transfers stream
through a CRC-32 so a file is read once; several run in parallel on a thread
pool (s3fs is async inside; its sync API is safe from threads). Every call
here may be retried: uploads go to fresh unique names, small files are
replaced whole.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Sequence, TypeVar

import fsspec.core

from ..errors import CheckpointPathError, CheckpointStorageError, CorruptCheckpointError
from ..names import check_base, check_name, create_new  # noqa: F401 -- check_base: restore.py imports it from here
from .manifest import CHUNK, PartitionManifest, format_checksum

if TYPE_CHECKING:
    from ..config import CheckpointConfig

T = TypeVar("T")
R = TypeVar("R")

# Stores whose single PUT is atomic and that have no cheap rename.
OBJECT_STORES = {"s3", "s3a", "gs", "gcs", "oss", "abfs", "abfss", "az", "adl", "memory", "r2"}

_CHK = re.compile(r"^chk-(\d+)$")


# -- the layout ----------------------------------------------------------------


def checkpoint_dir(checkpoint_id: int) -> str:
    return f"chk-{checkpoint_id:06d}"


def metadata_path(checkpoint_id: int) -> str:
    return f"{checkpoint_dir(checkpoint_id)}/_metadata"


def manifest_path(checkpoint_id: int, pid: int) -> str:
    return f"{checkpoint_dir(checkpoint_id)}/p{pid:04d}.json"


def group_path(checkpoint_id: int, owner: str) -> str:
    """The manifests of every partition of one store's checkpoint, one group in one file (``manifest_location``)."""
    return f"{checkpoint_dir(checkpoint_id)}/{owner}.json"


def manifest_location(manifest: PartitionManifest) -> str:
    """Where ``manifest`` is stored: its store's group (key groups), or a file of its own (format 1)."""
    group = manifest.key_group
    return manifest_path(manifest.checkpoint_id, manifest.partition) if group is None else group_path(manifest.checkpoint_id, group.node)


def private_path(checkpoint_id: int, owner: str, name: str) -> str:
    return f"{checkpoint_dir(checkpoint_id)}/{owner}/{name}"


def shared_path(owner: str, name: str) -> str:
    """A fresh unique name for an SST file: uploads never overwrite anything."""
    stem, _, ext = name.rpartition(".")
    return f"shared/{owner}/{stem}-{uuid.uuid4().hex}.{ext}"


def savepoint_dir(name: str) -> str:
    return f"savepoints/{check_name(name, 'savepoint name')}"


def checkpoint_id_of(path: str) -> int | None:
    """The checkpoint id of a path under ``chk-N/`` (None for anything else)."""
    m = _CHK.match(path.split("/", 1)[0])
    return int(m.group(1)) if m else None


def referenced_paths(manifests: Iterable[PartitionManifest], checkpoint_id: int) -> frozenset[str]:
    """The paths outside checkpoint ``checkpoint_id``'s folder that its manifests reference (a group's files,
    shared by its partitions' manifests, looked at once)."""
    lists = {id(m.files): m.files for m in manifests}
    return frozenset(f.path for files in lists.values() for f in files if checkpoint_id_of(f.path) != checkpoint_id)


def join(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p)


# -- the storage -----------------------------------------------------------------


class CheckpointStorage:
    """One cluster's checkpoints at ``url``: ``<url>/<cluster>/...``."""

    def __init__(self, url: str, storage_options: dict | None = None, cluster: str = "default", workers: int | None = None,
                 keys: tuple[bytes, ...] = (), accept_unsigned: bool = False) -> None:
        """``keys``: the checkpoint keys (``signing.checkpoint_key`` of each accepted node secret; the first signs);
        none: checkpoints are neither signed nor checked. ``accept_unsigned``: read checkpoints without an HMAC too."""
        check_name(cluster, "cluster name")
        self.keys, self.accept_unsigned = tuple(keys), accept_unsigned
        options = dict(storage_options or {})
        inner = url.rsplit("::", 1)[-1]  # a chained URL (simplecache::s3://...) stores at its innermost protocol
        protocol = inner.split("://", 1)[0] if "://" in inner else "file"
        if protocol in ("s3", "s3a"):
            endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
            if endpoint and "endpoint_url" not in options and "endpoint_url" not in options.get("client_kwargs", {}):
                options["endpoint_url"] = endpoint
        if protocol in ("file", "local"):
            options.setdefault("auto_mkdir", True)
        try:
            # a chained URL's options are for the filesystem that stores, keyed by its protocol
            self.fs, root = fsspec.core.url_to_fs(url, **({protocol: options} if "::" in url else options))
        except Exception as exc:  # noqa: BLE001 -- any filesystem's failure to start (a bad host, scheme or option)
            raise CheckpointStorageError(f"cannot use checkpoint storage {url!r}: {type(exc).__name__}: {exc}; "
                                         "check its scheme, host and credentials", url=url) from None
        self.url = url
        self.cluster = cluster
        self.protocol = protocol
        self.atomic_put = protocol in OBJECT_STORES
        self.base = f"{root.rstrip('/')}/{cluster}"
        if workers is None:  # object stores wait on the network; file systems on the CPU (checksums): a thread per core
            workers = 16 if self.atomic_put else max(2, os.cpu_count() or 1)
        self.workers = workers
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rockstate-storage")

    @classmethod
    def of(cls, config: "CheckpointConfig", keys: tuple[bytes, ...] = ()) -> "CheckpointStorage":
        return cls(config.url, config.storage_options, config.cluster, config.transfer_threads, keys,
                   getattr(config, "accept_unsigned", False))

    def __repr__(self) -> str:
        return f"CheckpointStorage({self.url!r}, cluster={self.cluster!r})"

    def full(self, rel: str) -> str:
        rel = rel.strip("/")
        if any(p in (".", "..") for p in rel.split("/")):
            raise CheckpointPathError(f"refusing {rel!r}: not a path inside the checkpoint storage", path=rel[:200])
        return f"{self.base}/{rel}" if rel else self.base

    def rel(self, full: str) -> str:
        """The inverse of ``full`` for a path the filesystem listed."""
        base, full = self.base.strip("/") + "/", full.strip("/")
        return full[len(base) :] if full.startswith(base) else full

    # -- small files -------------------------------------------------------------

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Replace ``rel`` whole: readers see the old bytes or the new, never a part."""
        path = self.full(rel)
        with self._errors(rel):
            if self.atomic_put:
                self.fs.pipe_file(path, data)
                return
            tmp = f"{path}.tmp-{uuid.uuid4().hex}"
            self.fs.pipe_file(tmp, data)
            try:
                self.fs.mv(tmp, path)
            except BaseException:
                self._rm_quietly([tmp])
                raise

    def read_bytes(self, rel: str) -> bytes:
        with self._errors(rel):
            return self.fs.cat_file(self.full(rel))

    # -- big files ---------------------------------------------------------------

    def upload(self, local: str, rel: str) -> tuple[int, str]:
        """Copy a local file to ``rel``; returns (size, checksum) of what was sent."""
        crc = n = 0
        with open(local, "rb", buffering=0) as src, self._errors(rel), self.fs.open(self.full(rel), "wb") as dst:
            while chunk := src.read(CHUNK):
                crc = zlib.crc32(chunk, crc)
                n += len(chunk)
                dst.write(chunk)
        return n, format_checksum(crc)

    def download(self, rel: str, local: str, size: int | None = None, checksum: str | None = None, exclusive: bool = False) -> int:
        """Copy ``rel`` to a local file (never through a symlink; ``exclusive``: a new file, never over one), checking
        its size and checksum; a bad copy is removed."""
        crc = n = 0
        dst = create_new(local, exclusive=exclusive)  # before the try: a file that was there already is not ours to remove
        try:
            with dst, self._errors(rel), self.fs.open(self.full(rel), "rb", block_size=CHUNK) as src:
                while chunk := src.read(CHUNK):
                    crc = zlib.crc32(chunk, crc)
                    n += len(chunk)
                    dst.write(chunk)
            if size is not None and n != size:
                raise CorruptCheckpointError(f"{self.url}/{self.cluster}/{rel} has {n} bytes, the manifest says {size}", path=rel)
            if checksum is not None and format_checksum(crc) != checksum:
                raise CorruptCheckpointError(
                    f"{self.url}/{self.cluster}/{rel} fails its checksum ({format_checksum(crc)}, the manifest says {checksum})",
                    path=rel,
                )
        except BaseException:
            try:
                os.unlink(local)
            except FileNotFoundError:
                pass
            raise
        return n

    def copy(self, src_rel: str, dst_rel: str) -> None:
        """Server-side copy where the store has one (S3 CopyObject); a plain copy elsewhere."""
        with self._errors(src_rel):
            self.fs.copy(self.full(src_rel), self.full(dst_rel))

    # -- listing and deleting --------------------------------------------------------

    def exists(self, rel: str) -> bool:
        self._fresh()
        return self.fs.exists(self.full(rel))

    def size(self, rel: str) -> int:
        with self._errors(rel):
            return int(self.fs.size(self.full(rel)))

    def list(self, prefix: str = "") -> list[str]:
        """Every file under ``prefix``, as paths relative to the cluster's folder."""
        self._fresh()
        try:
            with self._errors(prefix):
                found = self.fs.find(self.full(prefix))
        except CorruptCheckpointError:  # the folder is not there yet
            return []
        return sorted(self.rel(p) for p in found)

    def checkpoint_ids(self, prefix: str = "") -> list[int]:
        """Ids of every ``chk-N`` folder, complete or not."""
        self._fresh()
        try:
            with self._errors(prefix):
                names = self.fs.ls(self.full(prefix), detail=False)
        except CorruptCheckpointError:  # the folder is not there yet
            return []
        ids = (checkpoint_id_of(n.rstrip("/").rsplit("/", 1)[-1]) for n in names)
        return sorted(i for i in ids if i is not None)

    def completed_ids(self, prefix: str = "") -> list[int]:
        """Ids of the checkpoints whose ``_metadata`` is written."""
        self._fresh()
        try:
            with self._errors(prefix):
                found = self.fs.glob(self.full(join(prefix, "chk-*/_metadata")))
        except CorruptCheckpointError:  # the folder is not there yet
            return []
        ids = (checkpoint_id_of(self.rel(p)[len(prefix) :].strip("/")) for p in found)
        return sorted(i for i in ids if i is not None)

    def savepoint_names(self) -> list[str]:
        self._fresh()
        try:
            with self._errors("savepoints"):
                found = self.fs.glob(self.full("savepoints/*/_savepoint"))
        except CorruptCheckpointError:  # the folder is not there yet
            return []
        return sorted(self.rel(p).split("/")[1] for p in found)

    def delete(self, rels: Iterable[str]) -> None:
        """Delete files; one already gone is fine."""
        if isinstance(rels, str):
            raise TypeError("delete() takes a list of paths")
        paths = [self.full(self._below(r)) for r in rels]
        if paths:
            self._rm_quietly(paths)

    def delete_tree(self, rel: str) -> None:
        try:
            self.fs.rm(self.full(self._below(rel)), recursive=True)
        except FileNotFoundError:
            pass

    # -- parallel work ------------------------------------------------------------

    def parallel(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """``fn`` over ``items`` on the pool; waits for all, then raises the first error (in item order)."""
        if len(items) <= 1:
            return [fn(i) for i in items]
        futures: list[Future] = [self._pool.submit(fn, i) for i in items]
        errors = [f.exception() for f in futures]
        for exc in errors:
            if exc is not None:
                raise exc
        return [f.result() for f in futures]

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    # -- helpers ----------------------------------------------------------------

    @staticmethod
    def _below(rel: str) -> str:
        """Refuse a path that is not strictly inside the cluster's folder (deleting it would delete everything)."""
        parts = rel.strip("/").split("/")
        if not rel.strip("/") or any(p in ("", ".", "..") for p in parts):
            raise CheckpointPathError(f"refusing to delete {rel!r}: not a path inside the checkpoint storage", path=rel)
        return rel

    def _fresh(self) -> None:
        if self.atomic_put:
            self.fs.invalidate_cache()  # s3fs caches listings; another process may have written since

    def _rm_quietly(self, paths: list[str]) -> None:
        try:
            self.fs.rm(paths)
        except FileNotFoundError:
            for p in paths:
                try:
                    self.fs.rm_file(p)
                except FileNotFoundError:
                    pass

    @contextlib.contextmanager
    def _errors(self, rel: str) -> Iterator[None]:
        """A missing file becomes CorruptCheckpointError; other I/O failures CheckpointStorageError."""
        where = f"{self.url}/{self.cluster}/{rel}"
        try:
            yield
        except (CorruptCheckpointError, CheckpointStorageError):
            raise
        except FileNotFoundError:
            raise CorruptCheckpointError(f"{where} is missing", path=rel) from None
        except Exception as exc:
            if isinstance(exc, (OSError, TimeoutError)) or type(exc).__module__.split(".")[0] in ("botocore", "aiobotocore", "s3fs"):
                raise CheckpointStorageError(f"checkpoint storage failed on {where}: {type(exc).__name__}: {exc}", path=rel) from exc
            raise
