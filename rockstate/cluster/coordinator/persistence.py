"""Where a coordinator keeps what it must not lose: its data directory, or ZooKeeper.

A coordinator's *record* is one dict of sections (``table``, ``states``,
``members`` and ``next_id``, ``pipelines``, ``failovers``, and whatever section
is added later) plus its event log. Both keepers answer the same three things:

- ``load()``: the record last saved ({} for a new cluster), and ``events``, the
  event log loaded with it;
- ``await save(record)``: the record is kept before the coordinator acts on it
  (a new table is saved before any node hears of it).

``DataDirectory`` is the single coordinator's format, unchanged:
``<data_dir>/coordinator.json`` (the record, replaced atomically) and
``events.jsonl``.

``ZooKeeperDocuments`` keeps one document per section under
``/rockstate/<cluster>/docs`` (``table`` with its epoch; ``membership``;
``states``; ``pipelines``; ``failovers``; a later section under its own name)
and ``events``, the last ``EVENT_WINDOW`` events. A save writes the documents
that changed in one ZooKeeper transaction, each at the version this coordinator
read or last wrote, fenced by its leadership: a deposed leader's save raises
``NotLeaderError``, an outdated one's ``StaleVersionError``, and either calls
``on_refused`` (the coordinator stops acting) before it propagates.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import Callable, cast

from ...errors import NotLeaderError, StaleVersionError
from ...files import read_json
from .events import EventLog
from ..zkstore import Leadership, ZooKeeperStore

log = logging.getLogger(__name__)

DOCUMENT_OF = {"members": "membership", "next_id": "membership"}  # sections kept together; any other: its own document
EVENTS = "events"
EVENT_WINDOW = 200  # events kept on ZooKeeper: what a new leader can still answer "events after N" from
UNKEPT = 100  # event numbers a new leader skips: more than a leader appends between two saves of its events


def write_text(path: str, text: str) -> None:
    """Replace ``path`` atomically and durably (``files.write_json``'s way, for text already encoded)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class DataDirectory:
    """One coordinator's record in its data directory."""

    def __init__(self, data_dir: str) -> None:
        self.path = os.path.join(data_dir, "coordinator.json")
        self.events = EventLog(os.path.join(data_dir, "events.jsonl"))

    def load(self) -> dict:
        return cast(dict, read_json(self.path) or {})

    async def save(self, record: dict) -> None:
        """Kept before it returns, without giving the loop away (no table goes out unsaved meanwhile); encoded by
        C's JSON encoder, not ``json.dump``'s pure-Python one with indents (at P=1024 9x the time)."""
        write_text(self.path, json.dumps(record, sort_keys=True))


class ZooKeeperDocuments:
    """The leading coordinator's record as documents on ZooKeeper, written only while it leads."""

    def __init__(self, store: ZooKeeperStore, leadership: Leadership, on_refused: Callable[[Exception], None]) -> None:
        self.store, self.leadership, self.on_refused = store, leadership, on_refused
        self.events = EventLog(None)
        self._saved: dict[str, dict] = {}  # document -> what it holds on ZooKeeper
        self._versions: dict[str, int] = {}
        self._record: dict = {}
        self._lock = asyncio.Lock()  # saves one at a time, each at the versions the last one left
        self._flush: asyncio.Task | None = None

    def load(self) -> dict:
        """Read every document (blocking: a newly elected leader calls it through a thread)."""
        self._saved, self._versions, record = {}, {}, {}
        for name in self.store.names():
            doc = self.store.read(name)
            if doc is None:
                continue
            self._saved[name], self._versions[name] = doc.data, doc.version
            if name != EVENTS:
                record.update(doc.data)
        # a deposed leader may have numbered a few events it did not keep: numbers only grow
        self.events = EventLog(None, self._saved.get(EVENTS, {}).get(EVENTS, []), skip=UNKEPT, on_append=self._events_appended)
        self._record = record
        return record

    def documents(self, record: dict) -> dict[str, dict]:
        documents: dict[str, dict] = {}
        for section, value in record.items():
            documents.setdefault(DOCUMENT_OF.get(section, section), {})[section] = value
        documents[EVENTS] = {EVENTS: self.events.latest(EVENT_WINDOW)}
        return documents

    async def save(self, record: dict) -> None:
        async with self._lock:
            self._record = record
            changed = {name: (data, self._versions.get(name)) for name, data in self.documents(record).items()
                       if self._saved.get(name) != data}
            if not changed:
                return
            try:
                written = await asyncio.to_thread(self.store.write_many, changed, self.leadership)
            except (NotLeaderError, StaleVersionError) as e:
                log.warning("ZooKeeper refused the coordinator's record (%s): it stops acting", e)
                self.on_refused(e)
                raise
            for name, doc in written.items():
                self._saved[name], self._versions[name] = doc.data, doc.version

    def _events_appended(self) -> None:
        """An event without a record change (a checkpoint, a retry) is kept soon after, by itself."""
        if self._flush is None or self._flush.done():
            try:
                self._flush = asyncio.get_running_loop().create_task(self._save_events())
            except RuntimeError:  # no loop: the next save carries it
                pass

    async def _save_events(self) -> None:
        try:
            await self.save(self._record)
        except Exception as e:  # refused: on_refused ran; unavailable: the next save carries them
            log.warning("the coordinator's events were not kept on ZooKeeper yet: %s", e)
