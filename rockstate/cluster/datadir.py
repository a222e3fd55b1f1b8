"""One process per data directory: a coordinator's or node's directory is locked before it registers or serves.

The lock is an ``flock`` on ``<data_dir>/rockstate.lock``: the kernel drops it
when its holder exits, even by SIGKILL, so a crashed process never leaves a
stale lock behind. The file names its holder (role and pid), and the refusal
names it too, so the operator knows which process to look at.
"""

from __future__ import annotations

import fcntl
import os
from typing import IO, Any

from ..errors import DataDirInUseError
from ..store.store import read_json

LOCK_FILE = "rockstate.lock"


def lock(data_dir: str, role: str) -> IO[str]:
    """Hold ``data_dir`` for this process (until ``release``), or raise ``DataDirInUseError``."""
    os.makedirs(data_dir, exist_ok=True)
    f = open(os.path.join(data_dir, LOCK_FILE), "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        saved: Any = read_json(os.path.join(data_dir, "address.json")) or {}
        address = saved.get("address")
        raise DataDirInUseError(
            f"data directory {data_dir} is in use by {holder}" + (f", serving on {address}" if address else "")
            + f": a second {role} on it would corrupt it. Stop that process first, or give this {role} its own --data-dir",
            data_dir=data_dir) from None
    f.seek(0)
    f.truncate()
    f.write(f"{role} process {os.getpid()}\n")
    f.flush()
    return f


def release(handle: IO[str] | None) -> None:
    if handle is not None:
        handle.close()  # closing the last descriptor drops the flock
