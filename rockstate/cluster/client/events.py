"""A client's subscription to the cluster's events."""

from __future__ import annotations

import threading
from typing import Callable

from ...errors import RockstateError


class Subscription:
    """A thread that long-polls the coordinator for events; ``close()`` stops it.

    Events are delivered in order, each once. A restarted coordinator keeps
    numbering where it stopped (cluster/events.py); one started without its
    data dir counts from 1 again, which the subscription notices and follows.
    """

    POLL = 1.0

    def __init__(self, events: Callable[[int, float], list[dict]], callback: Callable[[dict], None], after: int) -> None:
        """``events(after, wait)``: the coordinator's events after ``after``, waiting up to ``wait`` seconds for one."""
        self._events, self._callback, self.after = events, callback, after
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rockstate-events", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                events = self._events(self.after, self.POLL)
            except RockstateError:
                self._stop.wait(self.POLL)  # the coordinator is away; try again
                continue
            if events and events[0]["seq"] <= self.after:  # a coordinator without its old log: numbering restarted
                self.after = 0
            for event in events:
                if event["seq"] > self.after:
                    self.after = event["seq"]
                    self._callback(event)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(self.POLL + 5)

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
