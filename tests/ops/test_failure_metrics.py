"""A death shows at once: a killed node is suspect, then dead; its promotions are counted; the under-replicated
gauge and the events say what is short (issue 31, item 2). A real cluster, its /metrics and its status."""

import time
import urllib.request

from rockstate.local.cluster import wait_until
from rockstate.testing.cluster import gen_cluster

from .test_metrics import exported


def scrape(cluster) -> dict:
    return exported(urllib.request.urlopen(cluster.status_url + "metrics").read().decode())


def shown(cluster, node_id: str) -> str:
    return next(n["status"] for n in cluster.status()["nodes"] if n["node_id"] == node_id)


@gen_cluster(nodes=2, partitions=12, heartbeat_timeout=3.0)
def test_a_killed_node_is_suspect_then_dead_and_its_promotions_are_counted(cluster):
    cluster.wait_replicated()
    before = scrape(cluster)
    assert before['rockstate_coordinator_members{state="suspect"}'] == 0
    assert before["rockstate_coordinator_partitions_under_replicated"] == 0
    assert before['rockstate_coordinator_promotions_total{result="promoted"}'] == 0
    victim = next(n for n in cluster.status()["nodes"] if n["partitions"])
    primaries = victim["partitions"]

    cluster.kill_node(victim["node_id"])
    killed = time.monotonic()
    seen: list[str] = []
    while time.monotonic() - killed < 30 and (not seen or seen[-1] != "dead"):
        state = shown(cluster, victim["node_id"])
        if not seen or seen[-1] != state:
            seen.append(state)
            if state == "suspect":
                metrics = scrape(cluster)
                assert metrics['rockstate_coordinator_members{state="suspect"}'] == 1
                assert metrics["rockstate_coordinator_members_suspected_total"] == 1
        time.sleep(0.05)
    assert seen[-2:] == ["suspect", "dead"], seen  # suspect first, for a while before its death

    wait_until(lambda: cluster.status()["unavailable"] == 0, 30, "its partitions promoted")
    metrics = wait_until(lambda: (m := scrape(cluster))['rockstate_coordinator_promotions_total{result="promoted"}'] >= primaries and m,
                         30, "the promotions counted")
    assert metrics['rockstate_coordinator_promotions_total{result="promoted"}'] == primaries
    assert metrics['rockstate_coordinator_failover_partitions_total{how="promoted"}'] == primaries
    assert metrics["rockstate_coordinator_members_died_total"] == 1
    assert metrics['rockstate_coordinator_members{state="dead"}'] == 1
    assert metrics['rockstate_coordinator_members{state="suspect"}'] == 0
    # one live node left holds no backups: every partition is short of in-sync backups, as `rockstate status` says
    assert metrics["rockstate_coordinator_partitions_under_replicated"] == 12
    assert metrics["rockstate_coordinator_partitions_electing"] == 0
    events = [e["event"] for e in cluster.status()["events"] if e.get("node") == victim["node_id"] or e.get("previous") == victim["node_id"]]
    assert events.index("member_suspect") < events.index("member_dead") < events.index("primary_promoted")
    assert events.count("primary_promoted") == primaries
