"""The routing client's partition table: fetched from the coordinator, refreshed after a failed try, and waited for
between two tries.

A retry's wait is a ``GetTable`` with ``wait``: the coordinator answers as soon as it has sent the nodes a table
newer than this client's (a promotion after a node's death, a move's end), else after the wait with none. So a
partition that lost its owner is tried again once its new owner knows it, not at the end of a backoff drawn at
random, and waiting clients cost the coordinator one pending call each rather than a table every few tenths of a
second. A coordinator of an earlier version refuses the fields: the client then sleeps and refreshes, as before.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from ...errors import ProtocolError, RockstateError
from ...rpc.messages import Message
from .. import protocol as p
from ..leader_channel import CoordinatorChannel
from ..table import Table


class Tables:
    def __init__(self, coordinator: CoordinatorChannel, ask: Callable[[Message], Any], timeout: float, wait: bool) -> None:
        """``ask(msg)``: a call to the coordinator, retried while it restarts; ``wait``: the first fetch retried too."""
        self._coordinator, self._ask, self._timeout = coordinator, ask, timeout
        self._lock = threading.Lock()
        self._waited = True  # retries wait for a newer table (False: a coordinator of an earlier version)
        self.limits: dict = {}
        self.table = self.fetch(retry=wait)

    def fetch(self, retry: bool = True) -> Table:
        """The coordinator's table, as it is."""
        reply = self._ask(p.GetTable()) if retry else self._coordinator.call(p.GetTable())
        self.limits = reply["limits"]
        return Table.from_wire(reply)

    def refresh(self) -> Table:
        return self._take(self.fetch())

    def refresh_quietly(self) -> None:
        """``refresh``, a retryable failure left to the caller's next try."""
        try:
            self.refresh()
        except RockstateError as e:
            if not e.retryable:
                raise

    def wait(self, seconds: float) -> None:
        """A retry's wait: over once the coordinator has sent the nodes a newer table than this client's, or after
        ``seconds``; the table is fresh either way."""
        end = time.monotonic() + seconds
        if self._waited:
            try:
                waited = min(seconds, p.MAX_TABLE_WAIT)  # a longer backoff (a Retry of one's own) tries again sooner
                reply = self._coordinator.call(p.GetTable(newer_than=self.table.epoch, wait=waited), waited + self._timeout)
                if reply is not None:
                    self._take(Table.from_wire(reply))
                return
            except ProtocolError:  # a coordinator of an earlier version knows no such field
                self._waited = False
            except RockstateError as e:
                if not e.retryable:
                    raise
        time.sleep(max(0.0, end - time.monotonic()))
        self.refresh_quietly()

    def _take(self, table: Table) -> Table:
        with self._lock:
            if table.epoch > self.table.epoch:
                self.table = table
            return self.table
