"""Fixtures: checkpoint storage on the local filesystem, and on S3 through moto's server.

The S3 server is a real process (``python -m moto.server``) on 127.0.0.1 and a
free port, started once per session and stopped by its PID at the end. Each
test gets its own bucket; the AWS environment variables point at the server.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request
import uuid

import pytest

import rockstate
from rockstate.checkpoint.storage import CheckpointStorage
from rockstate.cluster.local import wait_until


def wait_for(condition, timeout=10.0, interval=0.02, what="condition"):
    return wait_until(condition, timeout, what, interval)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=0.5).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory):
    port = _free_port()
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: proc.poll() is not None or _answers(endpoint), timeout=30, what="moto server start")
        assert proc.poll() is None, "moto server exited at start"
        yield endpoint
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.fixture
def s3_env(s3_endpoint, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return s3_endpoint


@pytest.fixture
def s3_url(s3_env):
    import s3fs

    bucket = f"rockstate-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem(endpoint_url=s3_env).mkdir(bucket)
    return f"s3://{bucket}/checkpoints"


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
