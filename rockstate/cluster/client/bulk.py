"""The client's side of bulk ingestion: an SST file written, uploaded in chunks and ingested by the partition's owner.

The node's side, and the protocol, are in ``node/ingest.py``.
"""

from __future__ import annotations

import os
import uuid
from typing import TYPE_CHECKING, Iterable

from rocksdict import Options, SstFileWriter

from ...errors import IngestUploadError, RockstateError
from .. import protocol as p

if TYPE_CHECKING:
    from ...rpc.client import Channel

CHUNK = 8 << 20
"""Bytes of an upload's ``IngestChunk``."""


def write_sst(path: str, keys: Iterable[bytes], values: Iterable[bytes]) -> int:
    """Write stored ``keys`` (strictly ascending, bytewise) and ``values`` to a new SST file; returns its size.

    An empty file cannot be written: give at least one key.
    """
    writer = SstFileWriter(options=Options(raw_mode=True))
    writer.open(path)
    put = writer.__setitem__
    for _ in map(put, keys, values):  # a C-level loop: about 0.2 us a key
        pass
    writer.finish()
    return os.path.getsize(path)


def upload_and_ingest(channel: "Channel", epoch: int, pid: int, state: str, path: str, size: int, checksum: str,
                      timeout: float | None = None) -> int:
    """Upload the SST file at ``path`` to the node behind ``channel`` and ingest it; returns its size.

    Raises the node's error (NOT_OWNER, a moving partition...) for the caller
    to refresh and retry; the node drops the upload on any outcome of the
    ingest, and this drops it when the upload itself fails.
    """
    upload = uuid.uuid4().hex
    try:
        with open(path, "rb", buffering=0) as f:
            offset = 0
            while offset < size:
                data = f.read(CHUNK)
                if not data:
                    raise IngestUploadError(f"{path} ended at {offset} of {size} bytes")
                channel.call(p.IngestChunk(upload=upload, offset=offset, data=data), timeout)
                offset += len(data)
    except BaseException:
        try:
            channel.call(p.IngestAbort(upload=upload), timeout)
        except RockstateError:
            pass  # the node removes stale uploads itself
        raise
    return channel.call(p.IngestSst(epoch=epoch, partition=pid, state=state, upload=upload, size=size, checksum=checksum), timeout)
