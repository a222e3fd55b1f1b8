"""Who a node is and where it is reached: its advertised address, and one id per live node.

A node listening on a wildcard host (0.0.0.0, ::) cannot advertise it:
nobody reaches a node at 0.0.0.0. It advertises ``advertise_host`` when
set (containers, NAT, several interfaces), else this machine's name.

A node registering with the id of a member the coordinator believes alive,
from another address, is a copy of that node's identity (a restored or
copied data directory, a second process): it is refused while the holder
still answers as that id at its address. A holder that does not answer is
taken to have restarted at the new address.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

from ..errors import ConfigError, NodeIdInUseError, RockstateError
from ..rpc.async_client import AsyncChannel
from . import protocol as p

if TYPE_CHECKING:
    from ..control.membership import Member
    from .security import Security

WILDCARDS = frozenset({"", "0.0.0.0", "::", "[::]"})
HOLDER_TIMEOUT = 1.0  # seconds the holder of an id gets to answer


def advertised_address(host: str, advertise_host: str | None, port: int) -> str:
    name = advertise_host or (socket.getfqdn() if host in WILDCARDS else host)
    if name in WILDCARDS:
        raise ConfigError(f"advertise_host {name!r} is a wildcard: give an address others can reach this node at")
    return f"[{name}]:{port}" if ":" in name else f"{name}:{port}"


async def refuse_takeover(member: Member, address: str, security: Security) -> None:
    """Raise ``NodeIdInUseError`` if ``member`` (alive, at another address) still answers as itself."""
    if member.status != "alive" or member.address == address:
        return
    channel = AsyncChannel(member.address, name="coordinator", timeout=HOLDER_TIMEOUT, ssl=security.client_ssl, secret=security.secret)
    try:
        holder = await channel.call(p.NodeIdentity(), timeout=HOLDER_TIMEOUT)
    except RockstateError:
        return  # nothing answers there as a node: it restarted at the new address
    finally:
        await channel.close()
    if holder == member.node_id:
        raise NodeIdInUseError(
            f"node id {member.node_id} belongs to a live node at {member.address}; the node at {address} has a copy of its "
            "identity (a copied data directory?). Give it an empty data directory to join as a new node, or stop the other one",
            node_id=member.node_id, holder=member.address)
