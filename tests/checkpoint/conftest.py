"""Fixtures: checkpoint storage on the local filesystem, and on S3 through moto's server.

The S3 server is a real process (``python -m moto.server``) on 127.0.0.1 and a
free port, started once per session and stopped by its PID at the end. Each
test gets its own bucket; the AWS environment variables point at the server.
"""

from __future__ import annotations

import pytest

import rockstate
from rockstate.checkpoint.storage import CheckpointStorage
from rockstate.local.cluster import wait_until
from rockstate.testing.moto import ENV, moto_server, new_bucket


def wait_for(condition, timeout=10.0, interval=0.02, what="condition"):
    return wait_until(condition, timeout, what, interval)


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory):
    with moto_server(str(tmp_path_factory.mktemp("moto") / "moto.log")) as endpoint:
        yield endpoint


@pytest.fixture
def s3_env(s3_endpoint, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    return s3_endpoint


@pytest.fixture
def s3_url(s3_env):
    return f"s3://{new_bucket(s3_env)}/checkpoints"


@pytest.fixture(params=["file", "s3"])
def url(request, tmp_path):
    """A storage URL of each kind."""
    if request.param == "file":
        return f"file://{tmp_path}/storage"
    return request.getfixturevalue("s3_url")


@pytest.fixture
def file_url(tmp_path):
    return f"file://{tmp_path}/storage"


@pytest.fixture
def storage_of():
    """CheckpointStorage objects for tests to inspect or damage the storage with; closed at the end."""
    made = []

    def make(url, cluster="default"):
        made.append(CheckpointStorage(url, cluster=cluster))
        return made[-1]

    yield make
    for s in made:
        s.close()


@pytest.fixture
def open_store(tmp_path):
    """rockstate.open with checkpoints; every handle is closed at the end."""
    handles = []

    def make(name="db", partitions=4, **kwargs):
        handles.append(rockstate.open(str(tmp_path / name), partitions=partitions, **kwargs))
        return handles[-1]

    yield make
    for h in handles:
        h.close()
