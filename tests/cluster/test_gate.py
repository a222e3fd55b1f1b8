"""A node's gate: writes to a frozen partition wait until a change lifts the freeze, or give up retryably."""

import asyncio
import time

import pytest

from rockstate.cluster.node import ownership as gate_module
from rockstate.cluster.node.ownership import Gate
from rockstate.cluster.table import Table
from rockstate.errors import NotOwnerError, PartitionUnavailableError


def serving_gate() -> Gate:
    gate = Gate()
    gate.ownership.join("node-1", 2, lease=60.0, sent=time.monotonic())
    for pid in gate.apply_table(Table(1, ("node-1", "node-1"), {"node-1": "127.0.0.1:1"}, (1, 1))).opened:
        gate.ownership.opened(pid)
    return gate


def test_a_write_waits_for_the_unfreeze_and_one_for_a_released_partition_learns_the_new_owner():
    async def run():
        gate = serving_gate()
        gate.ownership.freeze(0)
        gate.ownership.freeze(1)
        unfrozen = asyncio.create_task(gate.writable([0], 1))
        released = asyncio.create_task(gate.writable([1], 1))
        await asyncio.sleep(0.05)
        assert not unfrozen.done() and not released.done()
        gate.unfreeze(0)
        assert await asyncio.wait_for(unfrozen, 1) == [0]
        assert not released.done()  # another partition's change wakes it, and it waits on
        gate.release(1)
        with pytest.raises(NotOwnerError):
            await asyncio.wait_for(released, 1)

    asyncio.run(run())


def test_a_write_gives_up_retryably_when_the_freeze_lasts(monkeypatch):
    monkeypatch.setattr(gate_module, "FREEZE_WAIT", 0.2)

    async def run():
        gate = serving_gate()
        gate.ownership.freeze(0)
        started = time.monotonic()
        with pytest.raises(PartitionUnavailableError, match="partition 0 is moving; retry") as info:
            await gate.writable([0], 1)
        assert info.value.retryable and 0.2 <= time.monotonic() - started < 2

    asyncio.run(run())
