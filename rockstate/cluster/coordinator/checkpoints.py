"""The cluster's checkpoints: the checkpoint driver (``checkpoint/driver.py``) with each node as a participant.

A node serves its partitions' part (``checkpoint/participants.py``'s
``LocalPartitions``) to the coordinator's driver through ``NodeParticipant``:
barrier N as ``SnapshotPartitions``, its outcome as ``FinishCheckpoint``, a
restore as ``RestorePartitions``. Partitions do not move while a checkpoint,
restore or savepoint runs: they hold the coordinator's table lock, so each
partition's barrier reaches exactly its one owner. ``ClusterCheckpoints`` is
what the coordinator holds: the driver, given explicitly what it needs from the
coordinator, answering in wire form.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Sequence

from ...checkpoint.driver import CheckpointDriver, policy_of
from ...checkpoint.manifest import PartitionManifest, from_group, is_group
from ...checkpoint.participants import Holding
from ...checkpoint.restore import PartitionRestore
from ...checkpoint.storage import CheckpointStorage
from ...config import CheckpointConfig
from ...errors import CheckpointError, CheckpointsNotConfiguredError, CheckpointStorageError
from ...retry import Retry
from ...rpc.async_client import AsyncChannel
from ...store import StateSpec
from .. import protocol as p
from .peers import Peer

log = logging.getLogger(__name__)

STORAGE_RETRY = Retry(deadline=15.0, initial=0.2, maximum=8.0)  # reading the storage at start: a crash loop helps nobody


class NodeParticipant:
    """A node's partitions, over RPC."""

    def __init__(self, node_id: str, channel: AsyncChannel, timeout: float) -> None:
        self.node_id, self.channel, self.timeout = node_id, channel, timeout

    def __str__(self) -> str:
        return f"node {self.node_id}"

    async def snapshot(self, checkpoint_id: int, retained: Sequence[int], partitions: list[int]) -> list[PartitionManifest | dict]:
        answer = await self.channel.call(p.SnapshotPartitions(checkpoint=checkpoint_id, retained=list(retained), partitions=partitions),
                                         timeout=self.timeout)
        if not is_group(answer):  # a list: a manifest each (a node of an earlier version)
            return answer
        try:
            return list(from_group(answer))
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"node {self.node_id} acked checkpoint {checkpoint_id} with a malformed manifest: {e}") from None

    async def finish(self, checkpoint_id: int, completed: bool, partitions: list[int]) -> None:
        await self.channel.call(p.FinishCheckpoint(checkpoint=checkpoint_id, completed=completed, partitions=partitions))

    async def restore(self, checkpoint_id: int, partitions: list[int], base: str = "") -> list[PartitionRestore]:
        answer = await self.channel.call(p.RestorePartitions(checkpoint=checkpoint_id, partitions=partitions, base=base),
                                         timeout=self.timeout)
        return [PartitionRestore(**s) for s in answer]


class ClusterCheckpoints:
    def __init__(self, config: CheckpointConfig, partitions: int, *, lock: asyncio.Lock,
                 owners: Callable[[], list[tuple[Any, list[int]]]], channel: Callable[[Any], AsyncChannel],
                 specs: Callable[[], dict[str, StateSpec]], define: Callable[[StateSpec], Awaitable[Any]],
                 event: Callable[..., None], keys: tuple[bytes, ...] = ()) -> None:
        """``owners()``: each live member with the partitions it owns; ``channel(member)``: a connection to it;
        ``specs()``: the catalog; ``define(spec)``: a state joins it; ``event(name, **data)``: record what happened."""
        self.config = config
        self.storage = CheckpointStorage.of(config, keys)  # keys: _metadata is signed and checked (docs/security.md)
        self._channel, self._define, self._owners = channel, define, owners
        self.driver = CheckpointDriver(self.storage, partitions, policy_of(config), lambda: self.holders(owners()),
                                       lock=lock, sweep=config.sweep, specs=specs, adopt_states=self._adopt_states, event=event)

    def holders(self, by_member: list[tuple[Any, list[int]]]) -> list[Holding]:
        return [(NodeParticipant(m.node_id, self._channel(m), self.config.timeout), pids) for m, pids in by_member]

    async def _adopt_states(self, states: dict) -> None:
        """The checkpoint's states join the catalog (a new cluster starting from a storage knows none)."""
        for spec in states.values():
            await self._define(StateSpec.from_dict(spec))

    async def open(self) -> None:
        """Read what the storage holds; a failing storage is retried for a while."""
        async def load() -> None:
            try:
                await self.driver.open()
            except CheckpointStorageError as exc:
                log.warning("reading the checkpoints in %s failed (%s); retrying", self.storage.url, exc)
                raise

        await STORAGE_RETRY.acall(load)

    def latest(self) -> int | None:
        return self.driver.latest()

    def history(self) -> list[dict]:
        return [r.to_dict() for r in self.driver.history()]

    async def periodic(self) -> None:
        await self.driver.periodic()

    def unaware(self, members: list[Peer]) -> list[str]:
        """Members registered while the cluster had another checkpoint storage or none (a node learns it only when
        it registers): a checkpoint they hold partitions of would abort. A member not known either way is tried."""
        return sorted(m.node_id for m in members if m.checkpoint_url not in (None, self.config.url))

    def refuse_unaware(self) -> None:
        """Refuse a checkpoint before it begins (so no ABORTED entry is left) when a holder does not know the storage
        (the coordinator tells every node before it asks this: one that did not take it), naming the nodes."""
        unaware = self.unaware([m for m, _ in self._owners()])
        if unaware:
            raise CheckpointsNotConfiguredError(
                f"node(s) {', '.join(unaware)} do not know the checkpoint storage {self.storage.url}: the coordinator could not "
                "tell them (its log says why; it tries again at their next heartbeat), or they run a version that cannot "
                "learn it live: restart them (rockstate node with the same --data-dir)")

    async def checkpoint(self, manual: bool = True) -> dict:
        self.refuse_unaware()
        return (await self.driver.checkpoint(manual)).to_dict()

    async def inspect(self, checkpoint_id: int) -> dict:
        return (await self.driver.inspect(checkpoint_id)).to_dict()

    async def restore(self, checkpoint_id: int | None = None, savepoint: str | None = None) -> dict:
        return (await self.driver.restore(checkpoint_id, savepoint)).to_dict()

    async def restore_partitions(self, checkpoint_id: int, by_member: list[tuple[Any, list[int]]]) -> list[PartitionRestore]:
        """Failover and a new cluster on a storage: these members' partitions from one checkpoint."""
        return await self.driver.restore_partitions(checkpoint_id, self.holders(by_member))

    async def savepoint(self, name: str, checkpoint_id: int | None = None) -> dict:
        if checkpoint_id is None:  # it takes a checkpoint first
            self.refuse_unaware()
        return (await self.driver.savepoint(name, checkpoint_id)).to_dict()

    async def savepoints(self) -> list[dict]:
        return [s.to_dict() for s in await self.driver.savepoints()]
