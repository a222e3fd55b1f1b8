"""S3 for tests and the chaos run: moto's server as a real process on 127.0.0.1, and buckets in it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import urllib.request
import uuid
from typing import Iterator

from ..local.runners import free_port, wait_until

ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=0.5).close()
        return True
    except OSError:
        return False


@contextlib.contextmanager
def moto_server(log_path: str) -> Iterator[str]:
    """Start ``python -m moto.server``; yields its endpoint URL; stops it by its PID."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: proc.poll() is not None or _answers(endpoint), 30, "moto server start")
        if proc.poll() is not None:
            raise RuntimeError(f"moto server exited at start (code {proc.returncode}); see {log_path}")
        yield endpoint
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def new_bucket(endpoint: str) -> str:
    import s3fs

    bucket = f"rockstate-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem(endpoint_url=endpoint, key=ENV["AWS_ACCESS_KEY_ID"], secret=ENV["AWS_SECRET_ACCESS_KEY"]).mkdir(bucket)
    return bucket
