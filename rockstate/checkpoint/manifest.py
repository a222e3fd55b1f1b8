"""What a checkpoint holds: a manifest per partition, and the ``_metadata`` that commits them.

A process's partitions are key groups of its one RocksDB, so one checkpoint of it holds them all: their
manifests are stored as one *group* (``group_bytes``, ``chk-N/<owner>.json``): the files once, and the
partitions whose key groups they hold. Writing, sending, parsing and naming it costs the files plus the
partitions, not their product (as one manifest per partition, each listing every file, did: 0.5 s a checkpoint
at P=1024 on 3 nodes, the coordinator parsing and hashing 1,024 copies of a node's file list).

Both are plain dicts of str/int/float/bool/list (msgpack-native, so a node can
ack with its manifest over the wire) and canonical JSON in the storage
(``sort_keys``, no spaces): the same dict always gives the same bytes, so the
coordinator can compute a manifest's checksum from the dict it was acked with.

Checksums are CRC-32 (``zlib.crc32``, written ``"crc32:1a2b3c4d"``). It is in
the standard library (no extra wheel for nodes and clients), runs at about
2 GB/s per core here (SHA-256: ~1 GB/s; crc32c would need a third-party
package), releases the GIL so parallel transfers verify in parallel, and S3
knows the same algorithm (``x-amz-checksum-crc32``). It guards against
truncation, bit rot and wrong files, not against an attacker.

The storage is not trusted (see docs/security.md): ``_metadata`` carries an
HMAC-SHA256 (``"hmac"``) under a key derived from the cluster's node secret,
which is never in the bucket, and names each manifest by its SHA-256 too
(``ManifestRef.digest``), so a planted or altered ``_metadata`` or manifest is
refused (``signing.py``; ``CheckpointAuthenticationError``, a ``CorruptCheckpointError``: a
restore falls back to the previous checkpoint). Every file name and path in
them is checked against ``names`` (one path component; relative paths of such
components), whatever the signature says. The data files themselves are
checked by CRC-32 only: someone who can write to the bucket can still change
the *contents* of a file it does not rename (a CRC can be forged), not where
anything is written.

Paths in a manifest are relative to the checkpoint's *base* (the cluster's
folder, or a savepoint's folder, which mirrors the same layout), so a
savepoint is a byte-for-byte copy that needs no rewriting.
"""

from __future__ import annotations

import json
import time
import zlib
from dataclasses import dataclass, field
from functools import cached_property
from typing import BinaryIO, Sequence

from ..errors import CorruptCheckpointError
from ..names import check_relative, inside
from .signing import canonical_json, digest_bytes, sign, verify

FORMAT = 3  # 3: a process's manifests as one group; 2: the same, each manifest whole in a bundle; 1: a RocksDB per partition
CHECKSUM_ALGORITHM = "crc32"
CHUNK = 4 << 20


def checksum_bytes(data: bytes) -> str:
    return format_checksum(zlib.crc32(data))


def checksum_stream(f: BinaryIO, size_hint: int | None = None) -> tuple[int, str]:
    """(bytes read, checksum) of the rest of ``f``."""
    crc = n = 0
    while chunk := f.read(CHUNK):
        crc = zlib.crc32(chunk, crc)
        n += len(chunk)
    return n, format_checksum(crc)


def checksum_file(path: str) -> tuple[int, str]:
    with open(path, "rb", buffering=0) as f:
        return checksum_stream(f)


def format_checksum(crc: int) -> str:
    return f"{CHECKSUM_ALGORITHM}:{crc & 0xFFFFFFFF:08x}"


@dataclass(frozen=True)
class FileEntry:
    """One file of a partition's RocksDB checkpoint."""

    name: str  # the file's name in the RocksDB directory, e.g. "000012.sst"
    path: str  # where it is, relative to the base: "shared/p0042/000012-<uuid>.sst"
    size: int
    checksum: str
    shared: bool  # an immutable SST that later checkpoints may reference
    uploaded: bool = False  # uploaded by this checkpoint (False: referenced from an earlier one)

    def to_dict(self) -> dict:  # not dataclasses.asdict: it deep-copies, and a checkpoint makes one per file
        return dict(vars(self))

    @classmethod
    def from_dict(cls, d: dict) -> "FileEntry":
        inside("", d["name"], "file name in a manifest")  # one path component: the file's place in the partition's folder
        check_relative(d["path"], "file path in a manifest")
        return cls(d["name"], d["path"], int(d["size"]), d["checksum"], bool(d["shared"]), bool(d.get("uploaded", False)))


@dataclass(frozen=True)
class KeyGroup:
    """Where a partition is in a process's RocksDB checkpoint: the files hold every partition ``node`` held, keys
    behind their partition's prefix; this one's are those of ``partition``. ``count``: how many partitions that
    checkpoint of the process holds (each manifest counts a ``count``-th of the files' bytes)."""

    node: str
    partition: int
    count: int

    def to_dict(self) -> dict:
        return dict(vars(self))

    @classmethod
    def from_dict(cls, d: dict) -> "KeyGroup":
        check_relative(d["node"], "node name in a manifest")
        count = int(d["count"])
        if count < 1:
            raise ValueError("a key group's count is positive")
        return cls(d["node"], int(d["partition"]), count)


@dataclass
class PartitionManifest:
    """The files of one partition in one checkpoint, and how the snapshot went."""

    partition: int
    checkpoint_id: int
    files: list[FileEntry]
    states: list[str]  # column families present (besides "default")
    created_at: float = field(default_factory=time.time)
    sync_seconds: float = 0.0  # how long the partition's writes paused
    async_seconds: float = 0.0  # uploads
    format: int = FORMAT
    key_group: KeyGroup | None = None  # None: the files are a RocksDB of this partition alone (format 1)

    @cached_property  # (a checkpoint asks each of its partitions: the files are set once)
    def size(self) -> int:
        """The partition's share of its files' bytes."""
        return sum(f.size for f in self.files) // (self.key_group.count if self.key_group else 1)

    @cached_property
    def uploaded_bytes(self) -> int:
        return sum(f.size for f in self.files if f.uploaded) // (self.key_group.count if self.key_group else 1)

    @property
    def shared_paths(self) -> set[str]:
        return {f.path for f in self.files if f.shared}

    @property
    def paths(self) -> set[str]:
        return {f.path for f in self.files}

    def to_dict(self) -> dict:
        return {
            "format": self.format,
            "partition": self.partition,
            "checkpoint_id": self.checkpoint_id,
            "files": [f.to_dict() for f in self.files],
            "states": list(self.states),
            "created_at": self.created_at,
            "sync_seconds": self.sync_seconds,
            "async_seconds": self.async_seconds,
            "size": self.size,
            "uploaded_bytes": self.uploaded_bytes,
            **({"key_group": self.key_group.to_dict()} if self.key_group else {}),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "PartitionManifest":
        if d.get("format", FORMAT) > FORMAT:
            raise CorruptCheckpointError(f"manifest format {d['format']} is newer than this rockstate reads ({FORMAT})")
        return cls(
            partition=int(d["partition"]),
            checkpoint_id=int(d["checkpoint_id"]),
            files=[FileEntry.from_dict(f) for f in d["files"]],
            states=list(d.get("states", [])),
            created_at=float(d.get("created_at", 0.0)),
            sync_seconds=float(d.get("sync_seconds", 0.0)),
            async_seconds=float(d.get("async_seconds", 0.0)),
            format=int(d.get("format", 1)),
            key_group=_key_group(d),
        )

    def to_json(self) -> bytes:
        return canonical_json(self.to_dict())

    @classmethod
    def from_json(cls, data: bytes, where: str = "manifest") -> "PartitionManifest":
        return _parse(cls, data, where)


def group_dict(manifests: Sequence[PartitionManifest]) -> dict:
    """The manifests of one process's checkpoint (the same files, states and times; a key group each) as one dict:
    what it stores and acks with."""
    first = manifests[0]
    return {
        "format": FORMAT,
        "checkpoint_id": first.checkpoint_id,
        "node": first.key_group.node if first.key_group else "",
        "partitions": sorted(m.partition for m in manifests),
        "files": [f.to_dict() for f in first.files],
        "states": list(first.states),
        "created_at": first.created_at,
        "sync_seconds": first.sync_seconds,
        "async_seconds": first.async_seconds,
    }


def group_bytes(manifests: Sequence[PartitionManifest]) -> bytes:
    return canonical_json(group_dict(manifests))


def is_group(d: object) -> bool:
    return isinstance(d, dict) and d.get("format") == 3 and isinstance(d.get("partitions"), list)


def from_group(d: dict) -> list[PartitionManifest]:
    """The manifests a ``group_dict`` holds, sharing one parsed file list (raises KeyError, TypeError, ValueError)."""
    if int(d["format"]) > FORMAT:
        raise CorruptCheckpointError(f"manifest format {d['format']} is newer than this rockstate reads ({FORMAT})")
    node = d["node"]
    check_relative(node, "node name in a manifest")
    pids = [int(pid) for pid in d["partitions"]]
    if not pids or len(set(pids)) != len(pids):
        raise ValueError("a group of manifests names each of its partitions once")
    files = [FileEntry.from_dict(f) for f in d["files"]]
    states = [str(name) for name in d["states"]]
    times = float(d["created_at"]), float(d["sync_seconds"]), float(d["async_seconds"])
    return [PartitionManifest(pid, int(d["checkpoint_id"]), files, states, *times, format=FORMAT,
                              key_group=KeyGroup(node, pid, len(pids))) for pid in pids]


def unbundle(data: bytes, pid: int, where: str) -> bytes:
    """Partition ``pid``'s manifest bytes out of ``data``: a bundle (format 2: each manifest whole), or the
    manifest itself."""
    if not data.startswith(b'{"format"'):
        return data
    try:
        d = json.loads(data)
        text = d["manifests"][str(pid)] if isinstance(d, dict) and "manifests" in d else None
    except (ValueError, KeyError, TypeError):
        raise CorruptCheckpointError(f"{where} is not a bundle of manifests holding p{pid}", path=where) from None
    if text is None:
        return data
    if not isinstance(text, str):
        raise CorruptCheckpointError(f"{where}: the manifest of p{pid} is not a JSON text", path=where)
    return text.encode()


def _key_group(d: dict) -> KeyGroup | None:
    if d.get("key_group") is None:
        return None
    group = KeyGroup.from_dict(d["key_group"])
    if group.partition != int(d["partition"]):
        raise ValueError(f"the manifest of p{d['partition']} names the key group of p{group.partition}")
    return group


@dataclass(frozen=True)
class ManifestRef:
    """How ``_metadata`` names a partition's manifest."""

    partition: int
    path: str
    size: int
    checksum: str
    data_size: int = 0  # the partition's files
    uploaded_bytes: int = 0
    digest: str = ""  # "sha256:<hex>" of the manifest's bytes ("" in checkpoints older than signing)

    def to_dict(self) -> dict:
        d = dict(vars(self))  # plain fields: no deep copy needed
        if not self.digest:
            del d["digest"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ManifestRef":
        check_relative(d["path"], "manifest path in _metadata")
        digest = d.get("digest", "")
        if not isinstance(digest, str):
            raise TypeError("digest must be a string")
        return cls(int(d["partition"]), d["path"], int(d["size"]), d["checksum"], int(d.get("data_size", 0)),
                   int(d.get("uploaded_bytes", 0)), digest)

    @classmethod
    def of(cls, manifest: PartitionManifest, path: str, data: bytes | None = None) -> "ManifestRef":
        """``data``: the bytes stored at ``path`` (default: the manifest alone); a group's name each of its partitions."""
        data = manifest.to_json() if data is None else data
        return cls(manifest.partition, path, len(data), checksum_bytes(data), manifest.size, manifest.uploaded_bytes, digest_bytes(data))


@dataclass
class CheckpointMetadata:
    """``chk-N/_metadata``: written last, it makes checkpoint N exist."""

    checkpoint_id: int
    partitions: int
    manifests: list[ManifestRef]
    states: dict[str, dict] = field(default_factory=dict)  # the state catalog: name -> StateSpec dict
    created_at: float = field(default_factory=time.time)
    duration: float = 0.0
    cluster: str = "default"
    format: int = FORMAT

    @property
    def size(self) -> int:
        return sum(m.data_size for m in self.manifests)

    @property
    def uploaded_bytes(self) -> int:
        return sum(m.uploaded_bytes for m in self.manifests)

    def manifest_ref(self, pid: int) -> ManifestRef:
        for ref in self.manifests:
            if ref.partition == pid:
                return ref
        raise CorruptCheckpointError(f"checkpoint {self.checkpoint_id} has no manifest for partition {pid}", checkpoint_id=self.checkpoint_id)

    def to_dict(self) -> dict:
        return {
            "format": self.format,
            "checkpoint_id": self.checkpoint_id,
            "partitions": self.partitions,
            "manifests": [m.to_dict() for m in self.manifests],
            "states": self.states,
            "created_at": self.created_at,
            "duration": self.duration,
            "cluster": self.cluster,
            "size": self.size,
            "uploaded_bytes": self.uploaded_bytes,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "CheckpointMetadata":
        if d.get("format", FORMAT) > FORMAT:
            raise CorruptCheckpointError(f"checkpoint format {d['format']} is newer than this rockstate reads ({FORMAT})")
        meta = cls(
            checkpoint_id=int(d["checkpoint_id"]),
            partitions=int(d["partitions"]),
            manifests=[ManifestRef.from_dict(m) for m in d["manifests"]],
            states=dict(d.get("states") or {}),
            created_at=float(d.get("created_at", 0.0)),
            duration=float(d.get("duration", 0.0)),
            cluster=d.get("cluster", "default"),
            format=int(d.get("format", 1)),
        )
        if sorted(m.partition for m in meta.manifests) != list(range(meta.partitions)):
            raise CorruptCheckpointError(f"checkpoint {meta.checkpoint_id}: _metadata does not name one manifest per partition")
        return meta

    def to_json(self, key: bytes | None = None) -> bytes:
        """Canonical JSON; with ``key``, carrying its HMAC (``"hmac"``)."""
        return canonical_json(self.to_dict() if key is None else sign(self.to_dict(), key))

    @classmethod
    def from_json(cls, data: bytes, where: str = "_metadata", keys: Sequence[bytes] = (), accept_unsigned: bool = True) -> "CheckpointMetadata":
        """``keys``: the keys an HMAC may be made with (none: not checked); ``accept_unsigned``: without an HMAC too."""
        return _parse(cls, data, where, keys, accept_unsigned)


def _parse(cls, data: bytes, where: str, keys: Sequence[bytes] = (), accept_unsigned: bool = True):
    try:
        out = json.loads(data)
        if not isinstance(out, dict):
            raise ValueError("not a JSON object")
        if keys:
            verify(out, keys, where, accept_unsigned)
        return cls.from_dict(out)
    except CorruptCheckpointError:
        raise
    except (ValueError, UnicodeDecodeError, KeyError, TypeError) as exc:
        raise CorruptCheckpointError(f"{where} is unreadable: {type(exc).__name__}: {exc}", path=where) from None

