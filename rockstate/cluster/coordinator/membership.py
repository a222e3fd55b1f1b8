"""The coordinator's handlers for its members: a node's registration, heartbeats and graceful leave.

``MemberHandlers`` is the part of ``Coordinator`` that serves them; what they decide comes from
``control/membership.py`` (who is alive) and the coordinator's rebalance and replica control.
"""

from __future__ import annotations

import logging
import time

from ...errors import PartitionUnavailableError, RockstateError
from ...retry import Retry
from .. import protocol as p
from ..identity import refuse_takeover

log = logging.getLogger(__name__)

WELCOME_RETRY = Retry(deadline=10.0, initial=0.2, maximum=2.0)
# a graceful leave's rounds of moves, until the leaving node holds no primary: a round that failed (a handover that
# timed out on a loaded machine) or left it a partition (a backup of a dead primary promoted to it) is planned again
LEAVE_RETRY = Retry(deadline=120.0, initial=0.5, maximum=5.0, retry_on=lambda e: isinstance(e, (RockstateError, OSError)))


class MemberHandlers:
    """A part of ``Coordinator`` (which has ``membership``, ``table``, ``replicas``, ``_rebalance`` and the rest)."""

    async def register(self, msg: p.Register, conn) -> dict:
        if msg.node_id in self.members:
            await refuse_takeover(self.members[msg.node_id], msg.address, self.security)
        node_id, joined = self.membership.register(msg.node_id, msg.address, time.monotonic())
        if msg.zone:
            self.replicas.zones[node_id] = msg.zone
        self.event("member_joined" if joined else "member_returned", node=node_id, address=msg.address)
        if self.membership.addresses() != self.table.addresses:
            self.table = self.table.with_addresses(self.membership.addresses())
        await self._save()
        self._spawn(self.replicas.returned(node_id))  # restarted before its partitions got a new primary: they are its again
        self._spawn(self._rebalance())
        return {
            "node_id": node_id,
            "partitions": self.table.partitions,
            "table": self.table.to_wire(),
            "states": [s.to_dict() for s in self.specs.values()],
            "limits": self._limits(),
            "heartbeat_timeout": self.config.heartbeat_timeout,  # the node's lease is half of it
            "checkpoints": self.checkpoint_config.model_dump() if self.checkpoints else None,
        }

    def _limits(self) -> dict:
        return {"max_key_bytes": self.config.max_key_bytes, "max_value_bytes": self.config.max_value_bytes}

    async def heartbeat(self, msg: p.Heartbeat, conn) -> int:
        if self.membership.heartbeat(msg.node_id, time.monotonic()):
            # it was cut off, not gone: partitions restored elsewhere meanwhile stay there
            member = self.membership[msg.node_id]
            self.event("member_returned", node=member.node_id, address=member.address)
            await self._save()
            self._spawn(self._welcome_back(member.node_id))
        return self.table.epoch

    async def _welcome_back(self, node_id: str) -> None:
        """A node back from being cut off learns the current table (it drops what was restored elsewhere), then gets its share.

        The first call often meets the connection the cut left behind, failing as the kernel gives up on it: asked again.
        """
        try:
            await WELCOME_RETRY.acall(self._send_table, node_id)
            await self.replicas.returned(node_id)
        except RockstateError as e:  # its heartbeats' answers name the newer table all the same
            log.warning("%s back from a cut did not take the table: %s", node_id, e)
        await self._rebalance()

    async def _send_table(self, node_id: str) -> None:
        async with self.table_lock:
            await self.peer(node_id).rpc(self.security).call(p.ApplyTable(table=self.table.to_wire()))

    async def leave(self, msg: p.Leave, conn) -> dict:
        if not self.membership.leave(msg.node_id):  # nobody to take its partitions: they wait on its disk for its return
            self.event("member_stopped", node=msg.node_id, reason="last node; partitions stay on its disk")
            await self._save()
            return {"moved": 0}
        moved = []

        async def round_of_moves() -> None:
            try:
                moved.append(await self._rebalance())
                if self._holds_primaries(msg.node_id):
                    raise PartitionUnavailableError(f"{msg.node_id} was given partitions while it left")
            except (RockstateError, OSError) as e:
                log.warning("%s leaving: a round of moves did not finish (%s); planning again", msg.node_id, e)
                raise

        try:
            await LEAVE_RETRY.acall(round_of_moves)
        except (RockstateError, OSError) as e:
            # it exits all the same: what did not move goes to its backups or the checkpoint, as for a death
            self.membership.leave_failed(msg.node_id)
            await self._declare_dead(msg.node_id, reason=f"its partitions could not all move off it: {e}")
            raise
        await self.replicas.moved_off(msg.node_id)  # never fewer in-sync replicas than configured while it leaves
        self.membership.left(msg.node_id)
        self.event("member_left", node=msg.node_id)
        await self._save()
        # its backup copies go with it: left in an in-sync set, primaries would wait for it and a promotion would ask it
        await self.replicas.members_dead([msg.node_id])
        return {"moved": sum(moved)}

    def _holds_primaries(self, node_id: str) -> bool:
        return node_id in self.table.owners or (self.replicas.enabled and node_id in self.replicas.owners())
