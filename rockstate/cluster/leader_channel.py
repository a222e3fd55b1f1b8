"""Reaching the leading coordinator among several: members' and clients' channel to "the coordinator".

Given ``host:port[,host:port...]`` (or ``zk://zkhost:port[,...]/<cluster>``:
the coordinators contending in that cluster's election on ZooKeeper, read
once), a call goes to the coordinator believed to lead. A standby answers
``NotLeaderError`` naming the leader: the call follows it. A standby that
knows no leader yet (an election in progress) or a coordinator that cannot be
reached: the next address is tried. After every
address has had its turns, the call fails with a retryable
``ConnectionLostError`` (callers retry it, as for a restarting coordinator).
With one address, errors are those of a plain channel.
"""

from __future__ import annotations

from typing import Any, Callable, Generic, TypeVar

from ..errors import ConfigError, ConnectionLostError, NotLeaderError, RockstateError
from ..rpc.async_client import AsyncChannel
from ..rpc.client import Channel
from ..rpc.messages import Message

ZK = "zk://"


def coordinator_addresses(spec: str) -> list[str]:
    """``"a:7700, b:7700"`` -> ["a:7700", "b:7700"]; ``"zk://zk1:2181,zk2:2181/orders"`` -> the contenders there."""
    if spec.startswith(ZK):
        return coordinators_on_zookeeper(spec)
    return [a.strip() for a in spec.split(",") if a.strip()] or [spec]


def coordinators_on_zookeeper(spec: str) -> list[str]:
    from .zkstore import ZooKeeperStore

    hosts, _, cluster = spec[len(ZK):].partition("/")
    if not hosts or not cluster:
        raise ConfigError(f"{spec!r}: give ZooKeeper and the cluster as zk://host:port[,host:port...]/<cluster_name>")
    with ZooKeeperStore(hosts, cluster, timeout=10.0) as store:
        contenders = store.contenders()
    if not contenders:
        raise ConnectionLostError(f"no coordinator of cluster {cluster!r} contends on ZooKeeper {hosts}: start one "
                                  "(rockstate coordinator --zookeeper ...), or check the cluster name", address=hosts)
    return contenders


class LeaderFinder:
    """Which coordinator to call next (no I/O): follow a redirect, else go round the list."""

    def __init__(self, addresses: list[str]) -> None:
        self.addresses = list(addresses)
        self.current = self.addresses[0]

    def turns(self) -> range:
        """Tries per call: each address twice (a redirect to a leader that just died), and one more."""
        return range(2 * len(self.addresses) + 1)

    def failed(self, error: RockstateError) -> None:
        """Where the next try goes after ``error``; raises it when it is not about who leads."""
        leader = error.data.get("leader") if isinstance(error, NotLeaderError) else None
        if leader and leader != self.current:
            if leader not in self.addresses:
                self.addresses.append(leader)
            self.current = leader
        elif isinstance(error, NotLeaderError) or (isinstance(error, ConnectionLostError) and len(self.addresses) > 1):
            self.current = self.addresses[(self.addresses.index(self.current) + 1) % len(self.addresses)]
        else:
            raise error

    def give_up(self, error: RockstateError) -> ConnectionLostError:
        return ConnectionLostError(f"no coordinator of {', '.join(self.addresses)} answered as the leader "
                                   f"(an election may be in progress; last: {error})", address=self.current)


C = TypeVar("C", Channel, AsyncChannel)


class _Coordinators(Generic[C]):
    def __init__(self, addresses: str, channel: Callable[[str], C]) -> None:
        self.finder = LeaderFinder(coordinator_addresses(addresses))
        self._new: Callable[[str], C] = channel
        self._channels: dict[str, C] = {}

    @property
    def address(self) -> str:
        return self.finder.current

    def _channel(self) -> C:
        if self.finder.current not in self._channels:
            self._channels[self.finder.current] = self._new(self.finder.current)
        return self._channels[self.finder.current]


class CoordinatorChannel(_Coordinators[Channel]):
    """Blocking, for clients."""

    def call(self, msg: Message, timeout: float | None = None) -> Any:
        for _ in self.finder.turns():
            try:
                return self._channel().call(msg, timeout)
            except RockstateError as e:
                self.finder.failed(e)
                last = e
        raise self.finder.give_up(last)

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()


class AsyncCoordinatorChannel(_Coordinators[AsyncChannel]):
    """asyncio, for nodes."""

    async def call(self, msg: Message, timeout: float | None = None) -> Any:
        for _ in self.finder.turns():
            try:
                return await self._channel().call(msg, timeout)
            except RockstateError as e:
                self.finder.failed(e)
                last = e
        raise self.finder.give_up(last)

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
