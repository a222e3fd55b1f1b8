"""INFO logs summarize (issue 31 item 7): a cluster of 128 partitions started on two nodes, then a third node
joining, logs one line per placement round and per burst of a move's per-partition events, not one per partition
(before: 343 coordinator lines and ~70 per node for the same; now about 80 and 10-20)."""

import os
import re

from rockstate import LocalCluster

PER_PARTITION = re.compile(r"event (migration_started|migration_finished|replica_copied|replica_out_of_sync|primary_promoted) ")


def info_lines(path: str) -> list[str]:
    with open(path, errors="replace") as f:
        return [line for line in f if " INFO " in line]


def test_a_start_and_a_join_log_a_line_per_round_not_per_partition(tmp_path):
    with LocalCluster(nodes=2, partitions=128, processes=True, root=str(tmp_path)) as c:
        c.add_node(wait=False)
        c.wait_replicated()
        with c.connect() as rs:  # every kept event: the status document holds only the last 100, which a join's copies fill
            moved = sum(e["event"] == "migration_finished" for e in rs.backend.events())
    logs = tmp_path / "logs"  # read once the processes stopped: the coordinator's last burst is written as it stops
    coordinator = info_lines(str(logs / "coordinator.log"))
    nodes = {name: info_lines(str(logs / name)) for name in os.listdir(logs) if name != "coordinator.log"}
    assert len(nodes) == 3
    assert [line for line in coordinator if PER_PARTITION.search(line)] == []
    rounds = [line for line in coordinator if "placement: " in line and " to move (" in line]
    assert any("128 partition(s) assigned, 0 to move" in line for line in rounds), rounds  # the first placement: one line
    finished = sum(int(n) for line in coordinator for n in re.findall(r"(\d+) migration_finished \(", line))
    assert moved > 0 and finished >= moved, (moved, finished, coordinator)  # every move counted in a summary (and the stop's)
    # a line per partition, of any kind, would be 128 at least (343 lines before); the rest (a suspect member on a loaded
    # machine, joins, placement rounds) does not grow with the partitions
    assert len(coordinator) < 128, "".join(coordinator)
    for name, lines in nodes.items():
        assert not [line for line in lines if "primary of partition" in line], name
        assert len(lines) < 64, (name, "".join(lines))  # ~70 before, 64 of them one per partition


def test_event_lines_sum_a_burst_and_keep_other_events_whole(caplog):
    import asyncio
    import logging

    from rockstate.cluster.coordinator.events import EventLines

    async def burst() -> None:
        lines = EventLines(quiet=0.05, longest=10.0)
        for pid in range(64):
            lines.log("migration_finished", {"partition": pid, "source": "node-1", "target": "node-3" if pid % 2 else "node-2"})
        lines.log("member_joined", {"node": "node-3"})
        for pid in range(3):
            lines.log("replica_copied", {"partition": pid, "node": "node-2", "primary": "node-1", "bytes": 1_000_000})
        await asyncio.sleep(0.3)
        lines.log("replica_out_of_sync", {"partition": 1, "node": "node-2", "primary": "node-1", "reason": "unreachable"})
        lines.flush()  # as the coordinator stops

    with caplog.at_level(logging.INFO, logger="rockstate.cluster.coordinator.events"):
        asyncio.run(burst())
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert messages[0] == "event member_joined {'node': 'node-3'}"
    assert re.fullmatch(r"events over 0\.\d s: 64 migration_finished \(node-1 -> node-2: 32, node-1 -> node-3: 32\); "
                        r"3 replica_copied \(node-1 -> node-2: 3\), 3\.0 MB copied", messages[1]), messages[1]
    assert re.fullmatch(r"events over 0\.0 s: 1 replica_out_of_sync \(node-1 -> node-2 \(unreachable\): 1\)", messages[2]), messages
    assert len(messages) == 3
