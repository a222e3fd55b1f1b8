"""The coordinator's connections to its members: one kept channel each, redone when a member's address changes."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from ...control.membership import Member
from ...errors import ClusterError
from ...rpc.async_client import AsyncChannel
from ...rpc.messages import Message
from ..security import Security

log = logging.getLogger(__name__)


@dataclass
class Peer:
    """A member as the coordinator calls it."""

    node_id: str
    address: str
    channel: AsyncChannel | None = None
    checkpoint_url: str | None = None  # the member's (Member.checkpoint_url): the storage its registration named

    def rpc(self, security: Security) -> AsyncChannel:
        if self.channel is None or self.channel.address != self.address:
            self.channel = AsyncChannel(self.address, name="coordinator", timeout=60.0,
                                        ssl=security.client_ssl, secret=security.secret)
        return self.channel


class Peers:
    def __init__(self, security: Security, member: Callable[[str], Member]) -> None:
        """``member(node_id)``: the member by that id (KeyError: none)."""
        self.security = security
        self._member = member
        self._peers: dict[str, Peer] = {}

    def __getitem__(self, member: Member) -> Peer:
        peer = self._peers.setdefault(member.node_id, Peer(member.node_id, member.address))
        peer.address, peer.checkpoint_url = member.address, member.checkpoint_url
        return peer

    def of(self, node_id: str) -> Peer:
        """The member ``node_id`` (KeyError: not a member)."""
        return self[self._member(node_id)]

    def channel(self, node_id: str) -> AsyncChannel:
        return self.of(node_id).rpc(self.security)

    def address(self, node_id: str) -> str:
        return self.of(node_id).address

    async def broadcast(self, members: Iterable[Member], msg: Message) -> list[tuple[Peer, Any]]:
        """``msg`` to each member at once; their answers, or the errors they failed with (logged)."""
        peers = [self[m] for m in members]
        results = await asyncio.gather(*(peer.rpc(self.security).call(msg) for peer in peers), return_exceptions=True)
        for peer, r in zip(peers, results):
            if isinstance(r, BaseException):
                log.warning("%s to %s failed: %s", msg.op, peer.node_id, r)
        return list(zip(peers, results))

    async def ask_all(self, members: Iterable[Member], msg: Message) -> list[tuple[Peer, Any]]:
        """``msg`` to each member; their answers, or a ``ClusterError`` when one did not answer."""
        answers = await self.broadcast(members, msg)
        for peer, r in answers:
            if isinstance(r, BaseException):
                raise ClusterError(f"node {peer.node_id} at {peer.address} did not answer {msg.op}: {r}")
        return answers

    async def close(self) -> None:
        for peer in self._peers.values():
            if peer.channel is not None:
                await peer.channel.close()
