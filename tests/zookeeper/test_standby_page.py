"""A standby coordinator's status page, in a real headless Chromium: it names the leader instead of showing its own stale state."""

import os
import uuid

from rockstate.local.cluster import wait_until
from rockstate.files import read_json
from tests.ops.test_status_page import browser, needs_chromium  # noqa: F401 -- the fixture
from rockstate.testing.cluster import local_cluster

UPDATED = "return document.getElementById('updated').textContent"


@needs_chromium
def test_a_standbys_page_names_the_leader(browser, tmp_path, zookeeper):  # noqa: F811 -- the fixture
    with local_cluster(nodes=1, partitions=4, root=str(tmp_path / "cluster"), processes=False, coordinators=2,
                      zookeeper=zookeeper.hosts, coordinator_settings={"cluster_name": f"page-{uuid.uuid4().hex[:8]}"}) as cluster:
        leader = cluster.status()["coordinators"]["leader"]
        standby = 1 - cluster.coordinator_addresses.index(leader)
        browser.get(read_json(os.path.join(cluster.root, f"coordinator{standby or ''}", "address.json"))["status_url"])
        wait_until(lambda: f"the leader is {leader}" in browser.execute_script(UPDATED), 15, "the page to name the leader")
        assert "stands by" in browser.execute_script(UPDATED)
