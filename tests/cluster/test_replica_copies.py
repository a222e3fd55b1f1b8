"""New backups' copies (issue 33): a new cluster's backups of never-written partitions are empty copies (no files
sent), a written partition's backup gets its files, and the copies hold the data: after the primaries' node is
killed, every key reads back from the promoted backups."""

from __future__ import annotations

import pytest

from rockstate.local.cluster import wait_until
from rockstate.testing.cluster import gen_cluster
from rockstate.testing.workload import keys_for

PARTITIONS = 12


def copies(cluster, after: int = 0) -> list[dict]:
    return [e for e in cluster.status()["events"] if e["event"] == "replica_copied" and e["seq"] > after]


@pytest.mark.timeout(300)
@gen_cluster(nodes=2, partitions=PARTITIONS, processes=True, backup_count=1, heartbeat_timeout=6.0)
def test_backups_of_never_written_partitions_are_empty_copies_and_written_ones_carry_their_data(cluster):
    cluster.wait_replicated(120)
    first = copies(cluster)
    assert len(first) == PARTITIONS and all(e["bytes"] == 0 for e in first), first  # nothing written: no files sent
    last = max(e["seq"] for e in cluster.status()["events"])
    with cluster.connect(retry_timeout=60) as rs:
        state = rs.value_state("copied")
        keys = keys_for(rs, per_partition=20)
        state.put_many({k: f"value-{k}" for k in keys})
        rs.backend.refresh()
        cluster.add_node()  # backups and primaries move to it: written partitions copied with their files
        cluster.wait_replicated(120)
        moved = copies(cluster, last)
        assert moved and all(e["bytes"] > 0 for e in moved), moved
        # every partition whose primary is on the first node loses it: its backup, copied or not, is promoted
        victim = cluster.nodes()[0].node_id
        lost = rs.backend.refresh().owned_by(victim)
        assert lost
        cluster.kill_node(victim)
        wait_until(lambda: not set(rs.backend.refresh().owned_by(victim)), 60, "the victim's partitions promoted")
        assert state.get_many(keys) == [f"value-{k}" for k in keys]
