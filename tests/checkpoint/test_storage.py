"""CheckpointStorage over file:// and s3:// (moto's server): transfers, checksums, listing, copy."""

import os

import pytest

from rockstate.checkpoint.manifest import checksum_bytes, checksum_file
from rockstate.checkpoint.storage import CheckpointStorage, checkpoint_id_of, manifest_path, metadata_path, private_path, shared_path
from rockstate.errors import CheckpointStorageError, CorruptCheckpointError


def test_layout_names():
    assert metadata_path(123) == "chk-000123/_metadata"
    assert manifest_path(123, 42) == "chk-000123/p0042.json"
    assert private_path(123, "s9f", "CURRENT") == "chk-000123/s9f/CURRENT"
    a, b = shared_path("s9f", "000012.sst"), shared_path("s9f", "000012.sst")
    assert a.startswith("shared/s9f/000012-") and a.endswith(".sst") and a != b  # unique: never overwritten
    assert checkpoint_id_of("chk-000123/p0042.json") == 123 and checkpoint_id_of("shared/x") is None


def test_transfers_are_verified(url, storage_of, tmp_path):
    storage = storage_of(url, cluster="c1")
    src = tmp_path / "src.bin"
    data = os.urandom(9 << 20) + b"tail"  # more than one chunk
    src.write_bytes(data)
    size, checksum = storage.upload(str(src), "shared/p0000/a.sst")
    assert (size, checksum) == (len(data), checksum_bytes(data)) == checksum_file(str(src))
    out = tmp_path / "out.bin"
    assert storage.download("shared/p0000/a.sst", str(out), size, checksum) == size
    assert out.read_bytes() == data

    storage.write_bytes("shared/p0000/a.sst", data[:-1] + b"X")  # same size, one byte changed
    with pytest.raises(CorruptCheckpointError, match="fails its checksum"):
        storage.download("shared/p0000/a.sst", str(out), size, checksum)
    assert not out.exists()  # a bad copy is removed
    storage.write_bytes("shared/p0000/a.sst", data[:100])
    with pytest.raises(CorruptCheckpointError, match="has 100 bytes"):
        storage.download("shared/p0000/a.sst", str(out), size, checksum)
    with pytest.raises(CorruptCheckpointError, match="missing") as info:
        storage.download("shared/p0000/nope.sst", str(out), size, checksum)
    assert info.value.data["path"] == "shared/p0000/nope.sst"
    with pytest.raises(CorruptCheckpointError, match="missing"):
        storage.read_bytes("chk-000001/_metadata")


def test_small_files_listing_copy_and_delete(url, storage_of):
    storage = storage_of(url)
    assert storage.list() == [] and storage.checkpoint_ids() == [] and storage.completed_ids() == []
    storage.write_bytes("chk-000001/p0000.json", b"{}")
    storage.write_bytes("chk-000001/_metadata", b"m1")
    storage.write_bytes("chk-000002/p0000.json", b"{}")  # never completed
    storage.write_bytes("shared/p0000/x.sst", b"x")
    storage.write_bytes("chk-000001/_metadata", b"m1 again")  # replaced whole
    assert storage.read_bytes("chk-000001/_metadata") == b"m1 again"
    assert storage.list() == ["chk-000001/_metadata", "chk-000001/p0000.json", "chk-000002/p0000.json", "shared/p0000/x.sst"]
    assert storage.checkpoint_ids() == [1, 2] and storage.completed_ids() == [1]
    storage.copy("shared/p0000/x.sst", "savepoints/s/shared/p0000/x.sst")
    assert storage.read_bytes("savepoints/s/shared/p0000/x.sst") == b"x"
    assert storage.list("savepoints") == ["savepoints/s/shared/p0000/x.sst"]
    storage.delete(["shared/p0000/x.sst", "shared/p0000/gone.sst"])  # one already gone is fine
    storage.delete_tree("chk-000002")
    storage.delete_tree("chk-000099")
    assert storage.exists("chk-000001/_metadata") and not storage.exists("shared/p0000/x.sst")
    assert storage.checkpoint_ids() == [1]
    # nothing but the storage's own folder is touched: another cluster beside it is separate
    other = storage_of(url, cluster="other")
    assert other.list() == []


def test_delete_refuses_paths_outside_the_storage(file_url, storage_of):
    storage = storage_of(file_url)
    storage.write_bytes("chk-000001/_metadata", b"m")
    for bad in ("", "/", "..", "chk-000001/../.."):
        with pytest.raises(ValueError, match="refusing"):
            storage.delete_tree(bad)
        with pytest.raises(ValueError, match="refusing"):
            storage.delete([bad])
    with pytest.raises(TypeError):
        storage.delete("chk-000001/_metadata")  # a str is not a list of paths
    assert storage.exists("chk-000001/_metadata")


def test_parallel_runs_everything_then_raises_the_first_error(file_url, storage_of):
    storage = storage_of(file_url)
    done = []

    def work(i):
        if i == 2:
            raise ValueError("two")
        done.append(i)
        return i * 10

    assert storage.parallel(lambda i: i * 10, list(range(5))) == [0, 10, 20, 30, 40]
    with pytest.raises(ValueError, match="two"):
        storage.parallel(work, list(range(5)))
    assert sorted(done) == [0, 1, 3, 4]


def test_storage_errors_are_typed(tmp_path, storage_of):
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    storage = storage_of(f"file://{blocker}")  # the root is a file: nothing can be written under it
    with pytest.raises(CheckpointStorageError):
        storage.write_bytes("chk-000001/_metadata", b"x")
    assert CheckpointStorageError.retryable


def test_unknown_protocol_is_a_clear_error():
    with pytest.raises(CheckpointStorageError, match="nosuchfs"):
        CheckpointStorage("nosuchfs://bucket/x")


def test_s3_settings_from_storage_options_alone(s3_url, s3_endpoint, monkeypatch, open_store):
    import s3fs

    for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)  # the bucket exists; from here on only storage_options say where
    options = {"endpoint_url": s3_endpoint, "key": "testing", "secret": "testing", "client_kwargs": {"region_name": "us-east-1"}}
    rs = open_store(checkpoints=s3_url, storage_options=options)
    rs.value_state("v").put(1, "one")
    assert rs.checkpoint().id == 1
    assert s3fs.S3FileSystem(**options).exists(s3_url.removeprefix("s3://") + "/default/chk-000001/_metadata")
