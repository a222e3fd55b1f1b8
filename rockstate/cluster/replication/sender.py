"""A primary's sender to one backup node: what ``Primaries.outgoing`` gives, one ``ReplicaApply`` at a time, and the
answers handed back to ``Primaries.answered`` (batches queued meanwhile, of every partition, ride together)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from ...errors import PartitionUnavailableError, ProtocolError, RockstateError
from ...rpc.async_client import AsyncChannel
from .. import protocol as p
from .primary import Primaries

log = logging.getLogger(__name__)

FULL_EVERY = 0.1  # seconds between a sender's looks over all its partitions while writes flow
PROBE_TICKS = 4  # an idle in-sync copy is probed at every 4th tick (once a replica timeout), a joining one at each:
# at 16 nodes and P=1024 the probes of every tick were a resting node's CPU (0.05 s a second, 0.75 for 16 nodes)


class Sender:
    def __init__(self, node: str, primaries: Primaries, peer: Callable[[str], AsyncChannel],
                 address: Callable[[str], str | None], timeout: Callable[[], float]) -> None:
        """To backup ``node``, at ``address(node)`` (None: it has none) over ``peer(address)``; ``timeout()``: the
        table's replica timeout."""
        self.node, self._primaries, self._peer, self._address, self._timeout = node, primaries, peer, address, timeout
        self._wake = primaries.sender(node)
        self._stopping = self._due = False
        self._ticks = 0  # ticks so far: every PROBE_TICKS-th probes the in-sync copies too
        self._ticker: asyncio.TimerHandle | None = None
        self._runs = True  # batch puts' pieces as ``ReplicaApply.runs`` (False: the backup refused them)

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    def _tick(self) -> None:
        """Every quarter replica timeout: a look over all the partitions is due. One timer, re-armed as it fires,
        rather than a timeout around each wait (a timer made and cancelled per write was 5 % of a primary's time)."""
        self._due = True
        self._ticks += 1
        self._wake.set()
        if not self._stopping:
            self._ticker = asyncio.get_running_loop().call_later(self._timeout() / 4, self._tick)

    async def run(self) -> None:
        """Sends the backup its partitions' new batches as they come (only the partitions written since: the next
        write waits on it), and looks over all of them (lags, reports, probes, the logs' trim) every FULL_EVERY
        seconds while writes flow, every quarter replica timeout while none do, and when woken by a new table."""
        wake, last_full, probed = self._wake, 0.0, -PROBE_TICKS
        self._ticker = asyncio.get_running_loop().call_later(self._timeout() / 4, self._tick)
        try:
            while not self._stopping:
                await wake.wait()
                wake.clear()
                now = time.monotonic()
                full = self._due or not self._primaries.pending(self.node) or now - last_full > FULL_EVERY
                probe = full and self._ticks - probed >= PROBE_TICKS
                if full:
                    last_full, self._due = now, False
                if probe:
                    probed = self._ticks
                try:
                    await self.send_once(full, probe)
                except asyncio.CancelledError:
                    raise
                except Exception:  # noqa: BLE001 -- a sender must go on: log and retry
                    log.exception("replication to %s failed", self.node)
                    await asyncio.sleep(0.1)
        finally:
            if self._ticker is not None:
                self._ticker.cancel()

    async def send_once(self, full: bool = True, probe_in_sync: bool = True) -> None:
        node, primaries = self.node, self._primaries
        items, carried, runs = primaries.outgoing(node, full, probe_in_sync, self._runs)
        if not items and not runs:
            return
        address = self._address(node)
        try:
            if address is None:
                raise PartitionUnavailableError(f"backup {node} has no address")
            replies = await self._peer(address).call(p.ReplicaApply(items=items, runs=runs or None), timeout=self._timeout())
        except RockstateError as e:
            pids = {i[0] for i in items}.union(*(run[2] for run in runs))
            if runs and isinstance(e, ProtocolError) and e.data.get("field") == "runs":  # a node of an earlier version
                log.warning("backup %s refused runs (%s): batch puts go to it as items from now on", node, e)
                self._runs = False
                primaries.resend(node, pids)
                return
            log.warning("backup %s did not apply batches of partitions %s: %s", node, sorted(pids)[:8], e)
            primaries.unreachable(node, pids)
            await asyncio.sleep(min(0.2, self._timeout() / 4))
            return
        primaries.answered(node, replies, carried)
