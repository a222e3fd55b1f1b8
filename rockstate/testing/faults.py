"""Storage faults for tests: an fsspec filesystem that wraps another and makes its operations fail or slow down.

Use it by prefixing a checkpoint URL: ``faulty::file:///tmp/chk`` or
``faulty::s3://bucket/prefix`` (fsspec URL chaining; the ``faulty`` protocol
is registered through the ``fsspec.specs`` entry point, so every process —
coordinator and nodes — finds it). What to inject comes from the environment
variable ``ROCKSTATE_STORAGE_FAULTS`` (inherited by the processes a test
starts), JSON::

    {"seed": 7, "error_rate": 0.01, "latency_rate": 0.1, "latency": 0.05, "log": "/tmp/faults.jsonl"}

- ``error_rate``: the chance that a content operation (open, read or write
  of a stream, cat, pipe, copy, move, remove) raises ``OSError(EIO)`` — a
  stream may fail part-way, leaving a partial object behind, as a dropped
  connection does. Errors are never ``FileNotFoundError``: a missing file
  means a corrupt checkpoint to rockstate, a storage error means "try again".
- ``fail_first``: the number of content operations each process fails first, whatever ``error_rate``: a short
  run meets a storage error for certain (at 1 %, ~250 operations in all left one run in ~12 with none).
- ``latency_rate`` / ``latency``: the chance that any operation (listings
  too) first sleeps, and the most it sleeps (uniform in [0, latency]).
- ``log``: a JSON-lines file every injected fault is appended to, so a test
  can say what it injected across all its processes.

Listings and existence checks are slowed down but do not fail: rockstate
decides what a checkpoint is from them, and a real store that fails a LIST
fails it loudly, which the content operations already cover.

Each process draws from ``Random(f"{seed}:{pid}")``: the faults a process
meets follow from the seed and the order of its calls, which its threads
interleave, so a run is reproducible in what it injects, not call for call.
"""

from __future__ import annotations

import errno
import json
import os
import random
import threading
import time
from typing import Any

from fsspec.implementations.dirfs import DirFileSystem

ENV = "ROCKSTATE_STORAGE_FAULTS"


class FaultPlan:
    """What to inject, and a log of what was."""

    def __init__(self, seed: int = 0, error_rate: float = 0.0, latency_rate: float = 0.0, latency: float = 0.0, log: str | None = None,
                 fail_first: int = 0) -> None:
        for name, rate in (("error_rate", error_rate), ("latency_rate", latency_rate)):
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"{ENV}: {name} must be within [0, 1], got {rate!r}")
        if fail_first < 0:
            raise ValueError(f"{ENV}: fail_first must be >= 0, got {fail_first!r}")
        if latency < 0:
            raise ValueError(f"{ENV}: latency must be >= 0 seconds, got {latency!r}")
        self.error_rate, self.latency_rate, self.latency, self.log = error_rate, latency_rate, latency, log
        self._unfailed = fail_first  # content operations this process still fails first
        self._random = random.Random(f"{seed}:{os.getpid()}")
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls) -> "FaultPlan":
        raw = os.environ.get(ENV)
        if not raw:
            return cls()
        try:
            settings = json.loads(raw)
            return cls(**settings)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{ENV} must be a JSON object with seed, error_rate, latency_rate, latency, log, fail_first: {exc}") from None

    def _draw(self) -> float:
        with self._lock:
            return self._random.random()

    def delay(self, op: str, path: Any) -> None:
        if self.latency_rate and self._draw() < self.latency_rate:
            seconds = self._draw() * self.latency
            self._record("latency", op, path, seconds=round(seconds, 4))
            time.sleep(seconds)

    def maybe_fail(self, op: str, path: Any) -> None:
        self.delay(op, path)
        with self._lock:
            first, self._unfailed = self._unfailed > 0, max(0, self._unfailed - 1)
        if first or (self.error_rate and self._draw() < self.error_rate):
            self._record("error", op, path)
            raise OSError(errno.EIO, f"injected storage fault in {op}", str(path))

    def _record(self, kind: str, op: str, path: Any, **extra: Any) -> None:
        if self.log:
            line = json.dumps({"kind": kind, "op": op, "path": str(path), "pid": os.getpid(), "time": time.time(), **extra})
            with self._lock, open(self.log, "a") as f:
                f.write(line + "\n")


def read_log(path: str) -> list[dict]:
    """The faults injected so far (every process's), oldest first."""
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


class FaultyFile:
    """A file object whose reads and writes may fail part-way."""

    def __init__(self, f, plan: FaultPlan, path: str) -> None:
        self._f, self._plan, self._path = f, plan, path

    def read(self, *args):
        self._plan.maybe_fail("read", self._path)
        return self._f.read(*args)

    def write(self, data):
        self._plan.maybe_fail("write", self._path)
        return self._f.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()

    def __getattr__(self, name):
        return getattr(self._f, name)


class FaultyFileSystem(DirFileSystem):
    """Another fsspec filesystem, with the faults of ``FaultPlan.from_env()`` (or ``plan=``)."""

    protocol = "faulty"

    def __init__(self, fo: str | None = None, target_protocol: str | None = None, target_options: dict | None = None,
                 fs=None, plan: FaultPlan | None = None, **storage_options: Any) -> None:
        options = dict(target_options or {})
        if target_protocol in (None, "file", "local"):
            options.setdefault("auto_mkdir", True)
        super().__init__(path="/", fs=fs, target_protocol=target_protocol or "file", target_options=options, **storage_options)
        self.path = ""  # paths pass through unchanged: this wraps, it does not re-root
        self.plan = plan or FaultPlan.from_env()

    # content operations: slow, and may fail

    def open(self, path, mode="rb", *args, **kwargs):
        self.plan.maybe_fail(f"open({mode})", path)
        return FaultyFile(super().open(path, mode, *args, **kwargs), self.plan, path)

    def cat_file(self, path, *args, **kwargs):
        self.plan.maybe_fail("cat", path)
        return super().cat_file(path, *args, **kwargs)

    def pipe_file(self, path, *args, **kwargs):
        self.plan.maybe_fail("pipe", path)
        return super().pipe_file(path, *args, **kwargs)

    def copy(self, path1, path2, *args, **kwargs):
        self.plan.maybe_fail("copy", path1)
        return super().copy(path1, path2, *args, **kwargs)

    def mv(self, path1, path2, **kwargs):
        self.plan.maybe_fail("move", path1)
        return super().mv(path1, path2, **kwargs)

    def rm(self, path, *args, **kwargs):
        self.plan.maybe_fail("remove", path)
        return super().rm(path, *args, **kwargs)

    def rm_file(self, path, **kwargs):
        self.plan.maybe_fail("remove", path)
        return super().rm_file(path, **kwargs)

    # listings: slow only

    def ls(self, path, detail=True, **kwargs):
        self.plan.delay("list", path)
        return super().ls(path, detail=detail, **kwargs)

    def find(self, path, *args, **kwargs):
        self.plan.delay("list", path)
        return super().find(path, *args, **kwargs)

    def glob(self, path, **kwargs):
        self.plan.delay("list", path)
        return super().glob(path, **kwargs)

    def exists(self, path, **kwargs):
        self.plan.delay("exists", path)
        return super().exists(path, **kwargs)
