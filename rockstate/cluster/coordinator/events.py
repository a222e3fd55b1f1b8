"""The coordinator's event log: numbered cluster events that survive a coordinator restart.

Pipelines decide from events whether state was restored under them
(``partition_restored``), so an event must not vanish with a coordinator
killed right after it, and sequence numbers must keep growing across
restarts (a client waiting for "events after 57" must not miss a new 3).
Each event is appended to ``events.jsonl`` as one line before it is
announced; a process kill keeps what was written (the OS holds it), so no
fsync. On start the file is read back and compacted to the last ``KEEP``.
Without a path the log lives in memory from the events it is given (a
coordinator on ZooKeeper keeps its recent window there: ``persistence.py``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections import deque
from typing import Any, Callable, Iterable

log = logging.getLogger(__name__)

KEEP = 1000  # events kept in memory and in the file after compaction


class EventLog:
    def __init__(self, path: str | None, events: Iterable[dict] = (), skip: int = 0,
                 on_append: Callable[[], None] | None = None) -> None:
        """``skip``: numbers left out after the last event (ones a previous writer may have given away unkept);
        ``on_append()``: told of every event (a keeper that saves them)."""
        self.path = path
        self.events: deque[dict] = deque(_read(path) if path else events, maxlen=KEEP)
        self.seq = (self.events[-1]["seq"] + skip) if self.events else 0
        if path:
            self._write_all(path)  # compaction: the file holds what memory holds
        self._appended = 0
        self._changed = asyncio.Event()
        self.on_append = on_append

    def _write_all(self, path: str) -> None:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.writelines(json.dumps(e) + "\n" for e in self.events)
        os.replace(tmp, path)

    def append(self, event: str, **data: Any) -> dict:
        self.seq += 1
        entry = {"seq": self.seq, "time": time.time(), "event": event, **data}
        self.events.append(entry)
        if self.path:
            with open(self.path, "a") as f:
                f.write(json.dumps(entry) + "\n")
            self._appended += 1
            if self._appended >= 10 * KEEP:
                self._write_all(self.path)
                self._appended = 0
        self._changed.set()
        self._changed = asyncio.Event()
        if self.on_append is not None:
            self.on_append()
        return entry

    def after(self, seq: int) -> list[dict]:
        return [e for e in self.events if e["seq"] > seq]

    async def wait_after(self, seq: int, wait: float) -> list[dict]:
        """Events with a higher number than ``seq``, waiting up to ``wait`` seconds for the first."""
        deadline = time.monotonic() + wait
        while not (newer := self.after(seq)) and (left := deadline - time.monotonic()) > 0:
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                pass
        return newer

    def latest(self, n: int) -> list[dict]:
        return list(self.events)[-n:]


def _read(path: str) -> list[dict]:
    events = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    events.append(json.loads(line))
                except ValueError:  # the last line of a process killed mid-write
                    log.warning("skipping an unreadable line in %s", path)
    except FileNotFoundError:
        pass
    return events[-KEEP:]
