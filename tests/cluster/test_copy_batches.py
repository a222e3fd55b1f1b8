"""The coordinator's catch-ups in batches (``copy_batches.py``): one transfer per backup and primary carries every
partition waiting between them, and each node takes part in at most ``limit`` transfers at once -- a cap per node,
so transfers between other nodes go on meanwhile. ``send`` here records the transfers it is asked for and holds
each until the test lets it end (it stands for the ``ReplicaCatchUp`` a node answers; the scheduling is the unit)."""

import asyncio

from rockstate.cluster.replication.copy_batches import CopyBatches


class Transfers:
    """A ``send`` that records each transfer and holds it until ``finish`` ends it."""

    def __init__(self) -> None:
        self.started: list[tuple[str, str, dict]] = []
        self.in_flight: dict[str, int] = {}
        self.most: dict[str, int] = {}
        self._ends: dict[tuple[str, str], asyncio.Future] = {}

    async def send(self, node: str, primary: str, epochs: dict) -> dict:
        self.started.append((node, primary, dict(epochs)))
        for n in (node, primary):
            self.in_flight[n] = self.in_flight.get(n, 0) + 1
            self.most[n] = max(self.most.get(n, 0), self.in_flight[n])
        end = self._ends[node, primary] = asyncio.get_running_loop().create_future()
        try:
            await end
        finally:
            for n in (node, primary):
                self.in_flight[n] -= 1
        return {pid: 100 + pid for pid in epochs}

    def finish(self, node: str, primary: str) -> None:
        self._ends.pop((node, primary)).set_result(None)

    async def running(self, count: int) -> None:
        for _ in range(400):  # until that many transfers are under way (each starts after the batch's linger)
            if len(self._ends) == count:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{len(self._ends)} transfers under way, not {count}: {sorted(self._ends)}")


def test_a_transfer_carries_every_partition_waiting_between_a_pair_and_answers_each():
    async def run():
        transfers = Transfers()
        batches = CopyBatches(transfers.send, limit=2)
        copies = [asyncio.ensure_future(batches.copy("node-2", "node-1", pid, 7)) for pid in (3, 1, 2)]
        await transfers.running(1)
        assert transfers.started == [("node-2", "node-1", {3: 7, 1: 7, 2: 7})]
        transfers.finish("node-2", "node-1")
        assert await asyncio.gather(*copies) == [103, 101, 102]

    asyncio.run(run())


def test_each_node_takes_part_in_at_most_limit_transfers_and_other_pairs_go_on_meanwhile():
    async def run():
        transfers = Transfers()
        batches = CopyBatches(transfers.send, limit=1)
        first = asyncio.ensure_future(batches.copy("node-2", "node-1", 0, 1))
        other = asyncio.ensure_future(batches.copy("node-4", "node-3", 1, 1))  # disjoint: not held back
        behind = asyncio.ensure_future(batches.copy("node-3", "node-1", 2, 1))  # node-1 and node-3 are busy
        await transfers.running(2)
        assert {(n, p) for n, p, _ in transfers.started} == {("node-2", "node-1"), ("node-4", "node-3")}
        transfers.finish("node-2", "node-1")
        assert await first == 100
        await asyncio.sleep(0.2)  # node-1 is free; node-3 is not: still waiting
        assert len(transfers.started) == 2 and not behind.done()
        transfers.finish("node-4", "node-3")
        await transfers.running(1)
        transfers.finish("node-3", "node-1")
        assert await other == 101 and await behind == 102
        assert max(transfers.most.values()) == 1

    asyncio.run(run())
