"""Checkpoint storage is untrusted input: names and paths from manifests, copies and messages; signed _metadata.

Whoever can write to the bucket but has no cluster secret must not be able to write a file anywhere on a node
(docs/security.md). Real stores, real storage on file://, a real cluster; nothing mocked.
"""

from __future__ import annotations

import json
import os

import pytest

import rockstate
from rockstate.checkpoint.manifest import FileEntry, canonical_json, checksum_bytes
from rockstate.checkpoint.restore import load_manifests, load_metadata
from rockstate.checkpoint.storage import CheckpointStorage, manifest_path, metadata_path
from rockstate.cluster import protocol as p
from rockstate.cluster.transfer import receive_files
from rockstate.errors import (CheckpointAuthenticationError, CheckpointPathError, ClusterError, CorruptCheckpointError,
                              InvalidNameError)
from rockstate.names import check_relative, create_new, inside
from rockstate.testing.cluster import local_cluster

SECRET = "bucket writers do not know this"
BAD_NAMES = ["/etc/passwd", "../x", "../../../../tmp/x", "a/b", "", ".", "..", "-rf", "x\x00y", "x\n", "a..b", "[red]x[/red]",
             "x" * 129, "\u2025", None, 7]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_file_name_from_outside_must_be_one_path_component(name, tmp_path):
    entry = {"name": name, "path": "shared/p0000/000012-ab.sst", "size": 1, "checksum": "crc32:00000000", "shared": True}
    with pytest.raises((ValueError, TypeError)):
        FileEntry.from_dict(entry)
    with pytest.raises(ValueError):
        inside(str(tmp_path), name)


@pytest.mark.parametrize("path", ["/abs/x.sst", "../chk-000001/p0000/CURRENT", "shared/../../x", "shared//x", "shared/p0000/",
                                  "a/./b", "savepoints/../../x"])
def test_a_path_from_outside_must_be_relative_names(path):
    with pytest.raises(ValueError):
        check_relative(path)
    entry = {"name": "000012.sst", "path": path, "size": 1, "checksum": "crc32:00000000", "shared": True}
    with pytest.raises(ValueError):
        FileEntry.from_dict(entry)


def test_new_files_never_follow_a_symlink_nor_replace_a_file(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    os.symlink(victim, tmp_path / "link")
    with pytest.raises(OSError):
        create_new(str(tmp_path / "link"))
    with pytest.raises(OSError):
        create_new(str(tmp_path / "link"), exclusive=False)  # O_NOFOLLOW: not even to truncate
    with pytest.raises(FileExistsError):
        create_new(str(victim))
    assert victim.read_bytes() == b"precious"


def test_a_copys_listing_cannot_write_outside_its_target(tmp_path):
    target = tmp_path / "in" / "p0001"
    for name in ["../escaped", "/tmp/escaped-abs", ".hidden", "..", ""]:
        with pytest.raises(ClusterError):
            receive_files([[name, 3]], str(target), lambda buf: (buf.__setitem__(slice(0, len(buf)), b"x" * len(buf)) or len(buf)))
    assert not (tmp_path / "in" / "escaped").exists() and not os.path.exists("/tmp/escaped-abs")


@pytest.mark.parametrize("message, fields", [
    (p.Register, {"address": "127.0.0.1:1", "node_id": "../../../x<script>[/x]"}),
    (p.Register, {"address": "127.0.0.1:1", "node_id": "node-1", "zone": "[bold]z"}),
    (p.Heartbeat, {"node_id": "../n", "epoch": 1}),
    (p.Leave, {"node_id": "/n"}),
    (p.ReplicaReport, {"node_id": "a/b", "reports": []}),
    (p.ReplicaCopy, {"partitions": [0], "node": "../../outgoing"}),
    (p.CreateSavepoint, {"name": "../../chk-000001"}),
    (p.RestoreCluster, {"savepoint": "../x"}),
    (p.IngestChunk, {"upload": "../../x", "offset": 0, "data": b""}),
    (p.IngestSst, {"epoch": 1, "partition": 0, "state": "s", "upload": "/x", "size": 0, "checksum": "c"}),
    (p.IngestAbort, {"upload": ".."}),
    (p.NodeCount, {"state": "../s"}),
    (p.Count, {"state": "a/b"}),
])
def test_names_in_messages_are_checked_where_they_enter(message, fields):
    with pytest.raises(InvalidNameError):
        message.from_wire({**fields, "op": message.op})


@pytest.mark.parametrize("base", ["../other-cluster", "/etc", "savepoints/../../x", "chk-000001", "savepoints/a/b", "savepoints/"])
def test_a_restores_base_stays_under_the_clusters_folder(base):
    with pytest.raises(CheckpointPathError):
        p.RestorePartitions.from_wire({"op": p.RestorePartitions.op, "checkpoint": 1, "partitions": [0], "base": base})
    assert p.RestorePartitions.from_wire({"op": "restore_partitions", "checkpoint": 1, "partitions": [0],
                                          "base": "savepoints/release-1"}).base == "savepoints/release-1"


def _fill(rs, value):
    rs.value_state("v").put_many({i: f"{value}-{i}" for i in range(200)})


def _contents(rs):
    return rs.value_state("v").get_many(list(range(200)))


def _rewrite_metadata(storage, chk, change):
    """_metadata of ``chk`` changed by ``change(dict)``, its checksums recomputed (which needs no secret), unsigned."""
    meta = json.loads(storage.read_bytes(metadata_path(chk)))
    meta.pop("hmac", None)
    change(meta)
    storage.write_bytes(metadata_path(chk), canonical_json(meta))


def test_a_manifest_naming_absolute_and_parent_paths_is_refused_and_nothing_is_written_outside(tmp_path):
    """The finding: checksums recomputed, an absolute and a ../ name were written outside the data directory."""
    url = f"file://{tmp_path}/storage"
    outside_abs = tmp_path / "planted-abs.pth"
    outside_rel = tmp_path / "planted-rel.pth"
    with rockstate.open(str(tmp_path / "a"), partitions=2, checkpoints=url) as rs:
        _fill(rs, "first")
        c1 = rs.checkpoint()
        _fill(rs, "second")
        c2 = rs.checkpoint()
    storage = CheckpointStorage(url)
    m2 = load_manifests(storage, load_metadata(storage, c2.id))[0]
    sst = next(f for f in m2.files if f.shared)
    store_dir = tmp_path / "b" / "restoring" / "p0000"
    depth = len(store_dir.parts)
    evil = dict(m2.to_dict())
    evil["files"] = m2.to_dict()["files"] + [
        {**sst.to_dict(), "name": str(outside_abs)},
        {**sst.to_dict(), "name": "../" * depth + str(outside_rel).lstrip("/")},
    ]
    data = canonical_json(evil)
    storage.write_bytes(manifest_path(c2.id, 0), data)

    def point_at_it(meta):
        ref = next(m for m in meta["manifests"] if m["partition"] == 0)
        ref.update(path=manifest_path(c2.id, 0), size=len(data), checksum=checksum_bytes(data))  # a file of its own
        ref.pop("digest", None)
    _rewrite_metadata(storage, c2.id, point_at_it)

    with rockstate.open(str(tmp_path / "b"), partitions=2, checkpoints=url) as fresh:
        assert fresh.restored.checkpoint_id == c1.id  # refused, the previous one used
        [skip] = fresh.restored.skipped
        assert skip.checkpoint_id == c2.id and "unsafe file name" in skip.reason
        assert [v.startswith("first") for v in _contents(fresh)] == [True] * 200
    assert not outside_abs.exists() and not outside_rel.exists()
    storage.close()


def test_a_planted_or_altered_checkpoint_is_refused_and_the_previous_one_used(tmp_path):
    """With a cluster secret _metadata carries an HMAC: a bucket writer cannot make a checkpoint the cluster restores."""
    url = f"file://{tmp_path}/storage"
    storage = CheckpointStorage(url)
    (tmp_path / "c").mkdir()
    with local_cluster(nodes=1, partitions=4, root=str(tmp_path / "c"), processes=False, secret=SECRET, checkpoints=url,
                      backup_count=0) as cluster, cluster.connect() as rs:
        _fill(rs, "first")
        c1 = rs.checkpoint()
        _fill(rs, "second")
        c2 = rs.checkpoint()
        assert "hmac" in json.loads(storage.read_bytes(metadata_path(c2.id)))
        _fill(rs, "third")

        _rewrite_metadata(storage, c2.id, lambda meta: None)  # the same checkpoint, its HMAC stripped: a planted one
        result = rs.restore()
        assert result.checkpoint_id == c1.id and [s.checkpoint_id for s in result.skipped] == [c2.id]
        assert "carries no HMAC" in result.skipped[0].reason
        assert [v.startswith("first") for v in _contents(rs)] == [True] * 200

        signed = json.loads(storage.read_bytes(metadata_path(c1.id)))
        signed["created_at"] += 1  # altered, its HMAC kept
        storage.write_bytes(metadata_path(c1.id), canonical_json(signed))
        with pytest.raises(CorruptCheckpointError) as refused:
            rs.restore(c1.id)
        assert "fails its HMAC" in str(refused.value)
        assert [v.startswith("first") for v in _contents(rs)] == [True] * 200  # a refused restore changed nothing
    keyless = CheckpointStorage(url, keys=(b"another cluster's key",))
    with pytest.raises(CheckpointAuthenticationError):
        load_metadata(keyless, c2.id)
    storage.close()
    keyless.close()


class Raw:
    """A message as a peer that skips the client's checks would send it: any wire map."""

    def __init__(self, **wire):
        self.wire = wire

    def to_wire(self):
        return self.wire


def test_a_node_id_with_markup_and_dots_cannot_register(tmp_path):
    """The finding's fake node ``../../../x<script>[/x]`` is refused at the message, on a real coordinator."""
    from rockstate.rpc.client import Channel

    with local_cluster(nodes=1, partitions=2, root=str(tmp_path), processes=False, secret=SECRET) as cluster:
        channel = Channel(cluster.address, timeout=5, secret=SECRET.encode())
        with pytest.raises(InvalidNameError):
            channel.call(Raw(op="register", address="127.0.0.1:1", node_id="../../../x<script>[/x]"))
        assert [n["node_id"] for n in cluster.status()["nodes"]] == ["node-1"]
        channel.close()
