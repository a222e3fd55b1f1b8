"""The status page in a real headless Chromium (Debian's, driven by its chromedriver) against a real LocalCluster."""

import json
import os
import shutil
import urllib.error
import urllib.request

import pytest

from rockstate import LocalCluster
from rockstate.local.cluster import wait_until

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from rockstate.testing.cluster import gen_cluster, local_cluster

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
needs_chromium = pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="Debian's chromium and chromium-driver (scripts/setup.sh installs them)")


@pytest.fixture
def browser(tmp_path):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1280,1400", f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)  # no driver download: Debian's
    try:
        yield driver
    finally:
        driver.quit()


# read in one script: the page redraws itself every 2 s, so elements found one call earlier may be gone
def shown_nodes(driver) -> dict[str, int]:
    return driver.execute_script("""return Object.fromEntries([...document.querySelectorAll('#nodes tbody tr')]
        .map(r => [r.dataset.node, +r.querySelector('td.partitions').textContent]))""")


def shown_owners(driver) -> list[str]:
    return driver.execute_script("return [...document.querySelectorAll('#partition-map .cell')].map(c => c.dataset.owner)")


def shown_row(driver, node_id: str) -> str:
    return driver.execute_script("return document.querySelector(`#nodes tr[data-node='${arguments[0]}']`).textContent", node_id)


@needs_chromium
@gen_cluster(nodes=2, partitions=12, root="{tmp_path}/cluster", checkpoints="file://{tmp_path}/checkpoints", processes=True)
def test_page_shows_the_live_cluster_and_follows_a_join(cluster, browser, tmp_path):
    with cluster.connect() as rs:
        rs.value_state("carts").put_many({f"cart-{i}": {"items": i, "updated": "2026-11-23T12:00:00Z"} for i in range(300)})
        rs.checkpoint()
        rs.value_state("carts").put_many({f"cart-{i}": {"items": i + 1} for i in range(300, 900)})
        rs.checkpoint()
    browser.get(cluster.status_url)
    status = cluster.status()
    expected = {n["node_id"]: n["partitions"] for n in status["nodes"]}
    wait_until(lambda: shown_nodes(browser) == expected, 15, f"the page to show nodes {expected}")
    owners = json.load(urllib.request.urlopen(cluster.status_url + "api/status"))["owners"]
    assert shown_owners(browser) == owners and len(owners) == 12
    assert "12 partitions" in browser.execute_script("return document.getElementById('summary').textContent")
    bars = wait_until(lambda: browser.execute_script("return document.querySelectorAll('#checkpoint-chart rect').length"), 15, "the chart")
    assert bars == 2 and browser.execute_script("return document.querySelectorAll('#checkpoints tbody tr').length") == 2

    joined = cluster.add_node()  # waits until balanced
    after = {n["node_id"]: n["partitions"] for n in cluster.status()["nodes"]}
    assert joined.node_id in after and after[joined.node_id] > 0
    wait_until(lambda: shown_nodes(browser) == after, 15, f"the page to show the joined node: {after}")
    wait_until(lambda: joined.node_id in shown_owners(browser), 15, "the partition map to name the new owner")
    wait_until(lambda: "MiB" in shown_row(browser, joined.node_id), 15, "the new node's memory and disk figures")

    shot = tmp_path / "status-page.png"
    assert browser.save_screenshot(str(shot)) and os.path.getsize(shot) > 10_000
    print(f"\nstatus page screenshot: {shot}")


def test_page_and_api_are_behind_the_http_credential_not_the_secret(tmp_path):
    (tmp_path / "http-secret").write_text("http-s3cret\n")
    with local_cluster(nodes=1, partitions=4, root=str(tmp_path), secret="s3cret",
                       coordinator_settings={"http_secret_file": str(tmp_path / "http-secret")}) as cluster:
        url = cluster.status_url + "api/status"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url)
        assert refused.value.code == 401 and "Basic" in refused.value.headers["WWW-Authenticate"]
        refused.value.close()
        for wrong in ("nope", "s3cret"):  # the cluster's secret is not HTTP's
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": f"Bearer {wrong}"}))
            assert refused.value.code == 401
            refused.value.close()
        given = urllib.request.Request(url, headers={"Authorization": "Bearer http-s3cret"})
        with urllib.request.urlopen(given) as answer:
            assert json.load(answer)["partitions"] == 4


def shown_replicas(driver) -> list:
    """(partition, primary, [(backup, in sync)], waiting for election) per row of the replicas table."""
    return driver.execute_script("""return [...document.querySelectorAll('#replicas tbody tr')].map(r => [
        +r.dataset.partition, r.querySelector('td.primary').firstChild.textContent,
        [...r.querySelectorAll('span.backup')].map(b => [b.dataset.node, b.classList.contains('in-sync')]),
        !!r.querySelector('.electing')])""")


def api_replicas(cluster) -> list:
    return [[r["partition"], r["primary"] or "—", [[b["node"], b["in_sync"]] for b in r["backups"]], r["waiting_for_election"]]
            for r in json.load(urllib.request.urlopen(cluster.status_url + "api/status"))["replicas"]]


@needs_chromium
@gen_cluster(nodes=3, partitions=6, heartbeat_timeout=2.0)
def test_page_shows_each_partitions_primary_and_backups_through_a_failover(cluster, browser):
    browser.get(cluster.status_url)
    before = api_replicas(cluster)
    assert len(before) == 6 and all(len(backups) == 1 and backups[0][1] for _, _, backups, _ in before), before
    wait_until(lambda: shown_replicas(browser) == before, 15, f"the page to show the replicas {before}")
    summary = "return document.getElementById('replica-summary').textContent"
    assert "every backup in sync" in browser.execute_script(summary)

    victim = before[0][1]
    cluster.kill_node(victim)
    cluster.wait_replicated()  # its partitions promoted on their backups, new backups caught up
    seen: list = []

    def mirrored():
        seen[:] = [api_replicas(cluster), shown_replicas(browser)]
        return seen[0] == seen[1] and victim not in json.dumps(seen[0])

    wait_until(mirrored, 15, "the page to show the replicas after the failover")

    # the states a healthy cluster does not stay in long enough to be seen: the page's own drawing of them
    shown = browser.execute_script("""replicas(arguments[0]);
        return [document.getElementById('replica-summary').textContent, document.querySelector('#replicas tbody').textContent,
                document.querySelectorAll('#replicas tr.short').length]""", {
        "backup_count": 1, "replication": "sync", "replicas": [
            {"partition": 0, "primary": "node-1", "epoch": 4, "waiting_for_election": False,
             "backups": [{"node": "node-2", "in_sync": False}]},
            {"partition": 1, "primary": None, "epoch": 7, "waiting_for_election": True, "backups": []},
            {"partition": 2, "primary": "node-2", "epoch": 1, "waiting_for_election": False,
             "backups": [{"node": "node-1", "in_sync": True}]}]})
    assert "2 partitions short of in-sync backups" in shown[0], shown
    assert "node-2 (catching up)" in shown[1] and "waiting for election" in shown[1] and shown[2] == 2, shown
