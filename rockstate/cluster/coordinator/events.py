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

``EventLines`` writes them to the log: one INFO line per event, except the
ones that come one per partition (``ROUTINE``), which are logged at DEBUG
and summed into one INFO line per burst -- a join that moves 64 partitions
is a line, not 200.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections import Counter, deque
from typing import Any, Callable, Iterable

log = logging.getLogger(__name__)

KEEP = 1000  # events kept in memory and in the file after compaction
# one per partition, summed per burst (the event log keeps each): a move's steps, a backup's copy or fall out of sync,
# a promotion; a partition restored from a checkpoint keeps its line (it names the checkpoint)
ROUTINE = frozenset({"migration_started", "migration_finished", "replica_copied", "replica_out_of_sync", "primary_promoted"})
QUIET = 1.0  # seconds without a routine event that end a burst
LONGEST = 10.0  # seconds a burst is summed over at most (a line at least this often while moves go on)


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


class EventLines:
    """The log lines of the events (see the module's docstring)."""

    def __init__(self, quiet: float = QUIET, longest: float = LONGEST) -> None:
        self.quiet, self.longest = quiet, longest
        self._counts: Counter[tuple[str, str]] = Counter()  # (event, "source -> target") -> how many
        self._bytes = 0
        self._since = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def log(self, event: str, data: dict) -> None:
        if event not in ROUTINE:
            log.info("event %s %s", event, data)
            return
        log.debug("event %s %s", event, data)
        now = time.monotonic()
        if not self._counts:
            self._since = now
        where = (f"{data.get('source') or data.get('primary') or data.get('previous') or 'none'} -> "
                 f"{data.get('target') or data.get('node')}" + (f" ({data['reason']})" if data.get("reason") else ""))
        self._counts[event, where] += 1
        self._bytes += data.get("bytes") or 0
        if self._timer is not None:
            self._timer.cancel()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a test driving it by hand): nothing would come to end the burst
            self.flush()
            return
        self._timer = loop.call_later(0 if now - self._since >= self.longest else self.quiet, self.flush)

    def flush(self) -> None:
        """One line for the burst so far: each event's count, by source -> target."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._counts:
            return
        by_event: dict[str, list[tuple[str, int]]] = {}
        for (event, where), n in sorted(self._counts.items()):
            by_event.setdefault(event, []).append((where, n))
        parts = [f"{sum(n for _, n in wheres)} {event} ({', '.join(f'{w}: {n}' for w, n in wheres[:6])}"
                 f"{', ...' if len(wheres) > 6 else ''})" for event, wheres in by_event.items()]
        copied = f", {self._bytes / 1e6:.1f} MB copied" if self._bytes else ""
        log.info("events over %.1f s: %s%s", time.monotonic() - self._since, "; ".join(parts), copied)
        self._counts.clear()
        self._bytes = 0


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
