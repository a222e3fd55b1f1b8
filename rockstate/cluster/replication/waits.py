"""A request waiting until the batches of its partitions are applied by their backups (``Primaries.acknowledged``):
one future and one count for the whole request, however many partitions it reached."""

from __future__ import annotations

import asyncio


class Wait:
    """A request waiting until its partitions' batches are applied: done when the last of them is."""

    def __init__(self, done: asyncio.Future) -> None:
        self.done, self.remaining = done, 0

    def one_acknowledged(self) -> None:
        self.remaining -= 1
        if self.remaining == 0 and not self.done.done():
            self.done.set_result(None)

    def failed(self, error: Exception) -> None:
        if not self.done.done():
            self.done.set_exception(error)

    def expire(self) -> None:
        if not self.done.done():
            self.done.set_exception(TimeoutError())

    def cancel(self) -> None:
        """Waited for no more (answered, timed out, cancelled): ``Primaries._resolve`` drops its entries."""
        if not self.done.done():
            self.done.cancel()
