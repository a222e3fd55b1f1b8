"""``GET /healthz`` on a real coordinator: the verdict of ``rockstate status`` (``cluster/health.py``), as JSON and an HTTP status."""

import json
import urllib.error
import urllib.request

from rockstate.cluster.health import summarize
from rockstate.local.cluster import wait_until
from rockstate.testing.cluster import gen_cluster


def healthz(cluster) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(cluster.status_url + "healthz") as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


@gen_cluster(nodes=2, partitions=8, heartbeat_timeout=2.0)
def test_healthz_is_200_healthy_then_200_degraded_after_a_death(cluster):
    cluster.wait_balanced()
    wait_until(lambda: summarize(cluster.status())["verdict"] == "healthy", 30, "every backup in sync")
    code, body = healthz(cluster)
    assert (code, body["verdict"], body["exit_code"], body["reasons"]) == (200, "healthy", 0, [])
    assert body["partitions"] == 8 and body["without_live_owner"] == 0 and body["short_of_in_sync_backups"] == 0
    assert urllib.request.urlopen(cluster.status_url + "livez").read() == b"ok\n"

    victim = cluster.nodes()[0].node_id
    cluster.kill_node(victim)
    wait_until(lambda: any(n["status"] == "dead" for n in cluster.status()["nodes"]), 30, "the node to be declared dead")
    wait_until(lambda: cluster.status()["unavailable"] == 0, 30, "its partitions promoted")
    code, body = healthz(cluster)
    assert (code, body["verdict"], body["exit_code"]) == (200, "degraded", 1), body
    assert body["short_of_in_sync_backups"] == 8 and "8 partitions short of in-sync backups" in body["reasons"]
    assert body["nodes"]["dead"] == [victim]


@gen_cluster(nodes=2, partitions=8, heartbeat_timeout=2.0, backup_count=0)
def test_healthz_is_503_unavailable_when_a_partition_has_no_live_owner(cluster):
    cluster.wait_balanced()
    assert healthz(cluster)[0] == 200
    victim = cluster.nodes()[0].node_id
    cluster.kill_node(victim)
    wait_until(lambda: cluster.status()["unavailable"] > 0, 30, "a dead owner")
    code, body = healthz(cluster)
    assert (code, body["verdict"], body["exit_code"]) == (503, "unavailable", 2), body
    assert body["without_live_owner"] > 0 and any("without a live owner" in r for r in body["reasons"])
