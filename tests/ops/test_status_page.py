"""The status page in a real headless Chromium (Debian's, driven by its chromedriver) against a real LocalCluster.

The first test saves the page as a PNG; with ROCKSTATE_UPDATE_SCREENSHOT=1 as docs/images/status-page.png (the
picture docs/operations.md shows), else in its temporary directory: a test run leaves the checkout as it was."""

import base64
import contextlib
import json
import os
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from rockstate.keys import partition_of
from rockstate.local.cluster import wait_until

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from rockstate.testing.cluster import gen_cluster, local_cluster

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
needs_chromium = pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="Debian's chromium and chromium-driver (scripts/setup.sh installs them)")


@pytest.fixture
def browser(tmp_path):
    with chromium(tmp_path) as driver:
        yield driver


@contextlib.contextmanager
def chromium(tmp_path: Path):
    """Headless Chromium driven through Debian's chromedriver, its profile in ``tmp_path``."""
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


def shown_state(driver, name: str) -> list[str] | None:
    """The cells of the state table's row for ``name`` (None: no such row)."""
    return driver.execute_script("""const r = document.querySelector(`#states tr[data-state='${arguments[0]}']`);
        return r && [...r.cells].map(c => c.textContent)""", name)


def shown_sizes(driver) -> dict[int, tuple[str | None, str | None, str]]:
    """Each map cell's (keys, bytes) attributes and tooltip."""
    return {int(k): tuple(v) for k, v in driver.execute_script("""return Object.fromEntries([...document.querySelectorAll(
        '#partition-map .cell')].map(c => [c.dataset.partition, [c.dataset.keys ?? null, c.dataset.bytes ?? null, c.title]]))""").items()}


def shown_lines(driver, node_id: str) -> dict[str, list[float]]:
    """A node's sparklines in the load table: their points' count and largest value, by what they draw."""
    return driver.execute_script("""const r = document.querySelector(`#load tr[data-node='${arguments[0]}']`);
        return r ? Object.fromEntries([...r.querySelectorAll('svg.sparkline')].map(g => [g.parentElement.className,
            [+g.dataset.points, +g.dataset.max, g.querySelector('path').getAttribute('d').split('L').length]])) : {}""", node_id)


def full_page_screenshot(driver, path: Path) -> None:
    """The whole page, not only the window's part (Chromium's own capture beyond the viewport)."""
    width, height = driver.execute_script(
        "return [document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True, "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(base64.b64decode(shot["data"]))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and os.path.getsize(path) > 10_000


SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "images" / "status-page.png"


@needs_chromium
@gen_cluster(nodes=2, partitions=12, root="{tmp_path}/cluster", checkpoints="file://{tmp_path}/checkpoints", processes=True)
def test_page_shows_the_live_cluster_and_follows_a_join(cluster, browser, tmp_path):
    with cluster.connect() as rs:  # a Spark query's state (<query>.<operator>.<state>) with 5 keys: 7 partitions or more stay empty
        rs.value_state("q1.agg.counts").put_many({f"user-{i}": i for i in range(5)})
    written = {partition_of(f"user-{i}", 12) for i in range(5)}
    browser.get(cluster.status_url)
    # counted at most every 2 s on so little data: a count from before the writes may show first
    wait_until(lambda: (shown_state(browser, "q1.agg.counts") or [""] * 4)[3] == "5", 30, "the state table to count q1.agg.counts")
    name, kind, ttl, keys, size, query, operator = shown_state(browser, "q1.agg.counts")
    assert (kind, ttl, keys, query, operator) == ("value", "—", "5", "q1", "agg") and size.endswith(" B"), shown_state(browser, "q1.agg.counts")
    sizes = shown_sizes(browser)
    assert len(sizes) == 12 and all(sizes[p][0] is not None for p in range(12)), sizes
    assert sum(int(sizes[p][0]) for p in written) == 5 and all(int(sizes[p][1]) > 0 for p in written), sizes
    empty = min(set(range(12)) - written)
    assert sizes[empty][:2] == ("0", "0") and "0 keys" in sizes[empty][2], sizes
    assert f"{sizes[min(written)][0]} keys" in sizes[min(written)][2], sizes

    with cluster.connect() as rs:
        rs.value_state("carts").put_many({f"cart-{i}": {"items": i, "updated": "2026-11-23T12:00:00Z"} for i in range(300)})
        rs.checkpoint()
        rs.value_state("carts").put_many({f"cart-{i}": {"items": i + 1} for i in range(300, 900)})
        rs.checkpoint()
    status = cluster.status()
    expected = {n["node_id"]: n["partitions"] for n in status["nodes"]}
    wait_until(lambda: shown_nodes(browser) == expected, 15, f"the page to show nodes {expected}")
    owners = json.load(urllib.request.urlopen(cluster.status_url + "api/status"))["owners"]
    assert shown_owners(browser) == owners and len(owners) == 12
    assert "12 partitions" in browser.execute_script("return document.getElementById('summary').textContent")
    bars = wait_until(lambda: browser.execute_script("return document.querySelectorAll('#checkpoint-chart rect').length"), 15, "the chart")
    assert bars == 2 and browser.execute_script("return document.querySelectorAll('#checkpoints tbody tr').length") == 2
    # the nodes' own counters: the 900 puts show as a point above zero in each node's line of keys written
    for node_id in expected:
        wait_until(lambda: shown_lines(browser, node_id).get("keys_written_per_s", [0, 0])[1] > 0, 30,
                   f"{node_id}'s sparkline of keys written to rise")
        lines = shown_lines(browser, node_id)
        assert set(lines) == {"requests_per_s", "keys_written_per_s", "keys_read_per_s", "mean_latency_s"}, lines
        assert all(points >= 1 and segments == max(points, 2) for points, _, segments in lines.values()), lines  # one point: a flat line
        assert lines["requests_per_s"][1] > 0 and lines["mean_latency_s"][1] > 0, lines
    wait_until(lambda: (shown_state(browser, "carts") or [0] * 4)[3] == "900", 30, "the state table to count 900 carts")

    joined = cluster.add_node()  # waits until balanced
    after = {n["node_id"]: n["partitions"] for n in cluster.status()["nodes"]}
    assert joined.node_id in after and after[joined.node_id] > 0
    wait_until(lambda: shown_nodes(browser) == after, 15, f"the page to show the joined node: {after}")
    wait_until(lambda: joined.node_id in shown_owners(browser), 15, "the partition map to name the new owner")
    wait_until(lambda: "MiB" in shown_row(browser, joined.node_id), 15, "the new node's memory and disk figures")

    with cluster.connect() as rs:  # traffic until the joined node's own line shows it (and the picture has some)
        carts, keys = rs.value_state("carts"), [f"cart-{i}" for i in range(200)]

        def busy() -> bool:
            carts.put_many({k: {"items": 1} for k in keys})
            carts.get_many(keys)
            points, largest, segments = shown_lines(browser, joined.node_id).get("keys_read_per_s", [0, 0, 0])
            return largest > 0 and segments == max(points, 2)

        wait_until(busy, 40, f"{joined.node_id}'s line of keys read to rise", interval=0.1)
    shot = SCREENSHOT if os.environ.get("ROCKSTATE_UPDATE_SCREENSHOT") == "1" else tmp_path / "status-page.png"
    full_page_screenshot(browser, shot)
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


def shown_events(driver) -> list[str]:
    return driver.execute_script("return [...document.querySelectorAll('#events tbody tr')].map(r => r.dataset.event)")


def api(cluster, path: str) -> dict:
    with urllib.request.urlopen(cluster.status_url + path) as answer:
        return json.load(answer)


@needs_chromium
@gen_cluster(nodes=3, partitions=6, heartbeat_timeout=2.0)
def test_page_shows_each_partitions_primary_and_backups_through_a_failover(cluster, browser):
    browser.get(cluster.status_url)
    before = api_replicas(cluster)
    assert len(before) == 6 and all(len(backups) == 1 and backups[0][1] for _, _, backups, _ in before), before
    summary = "return document.getElementById('replica-summary').textContent"
    wait_until(lambda: "every backup in sync" in browser.execute_script(summary), 15, "the page to show the replicas in sync")
    # collapsed to the exceptions: none while every backup is in sync; all six after the toggle
    assert shown_replicas(browser) == [] and "show all 6 partitions (0 short)" in browser.execute_script(
        "return document.getElementById('replica-toggle').textContent")
    browser.find_element("id", "replicas-all").click()
    wait_until(lambda: shown_replicas(browser) == before, 15, f"the page to show every partition's replicas {before}")

    victim = before[0][1]
    cluster.kill_node(victim)
    cluster.wait_replicated()  # its partitions promoted on their backups, new backups caught up
    seen: list = []

    def mirrored():
        seen[:] = [api_replicas(cluster), shown_replicas(browser)]
        return seen[0] == seen[1] and victim not in json.dumps(seen[0])

    wait_until(mirrored, 15, "the page to show the replicas after the failover")

    # the event filter: replica_copied (new backups, many) unticked, member_dead still listed
    copied = [e for e in api(cluster, "api/events")["events"] if e["event"] == "replica_copied"]
    assert copied, "the failover copied new backups"
    wait_until(lambda: {"member_dead", "replica_copied"} <= set(shown_events(browser)), 15, "the events of the failover")
    browser.find_element("css selector", "#event-types input[data-type='replica_copied']").click()
    wait_until(lambda: "replica_copied" not in shown_events(browser), 15, "replica_copied hidden")
    shown = shown_events(browser)
    assert "member_dead" in shown and "member_joined" in shown, shown
    dead = api(cluster, "api/events?type=member_dead")
    assert {e["event"] for e in dead["events"]} == {"member_dead"} and victim in [e["node"] for e in dead["events"]], dead
    assert dead["types"]["replica_copied"] >= len(copied), dead  # counted over the log, whichever types were asked for
    for bad in ("type=Member_Dead", "type=member_dead%3Cscript%3E", "limit=0", "limit=1e3", "limit=-1", "since=1"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(cluster.status_url + "api/events?" + bad)
        assert refused.value.code == 400 and json.load(refused.value)["error"] == "INVALID_INPUT", bad
        refused.value.close()
    assert api(cluster, "api/status")["partitions"] == 6  # it serves on

    # the states a healthy cluster does not stay in long enough to be seen: the page's own drawing of them
    draw = """view.allReplicas = arguments[1]; replicas(arguments[0]);
        return [document.getElementById('replica-summary').textContent, document.querySelector('#replicas tbody').textContent,
                document.querySelectorAll('#replicas tr.short').length, document.querySelectorAll('#replicas tbody tr').length]"""
    document = {
        "backup_count": 1, "replication": "sync", "replicas": [
            {"partition": 0, "primary": "node-1", "epoch": 4, "waiting_for_election": False,
             "backups": [{"node": "node-2", "in_sync": False}]},
            {"partition": 1, "primary": None, "epoch": 7, "waiting_for_election": True, "backups": []},
            {"partition": 2, "primary": "node-2", "epoch": 1, "waiting_for_election": False,
             "backups": [{"node": "node-1", "in_sync": True}]}]}
    shown = browser.execute_script(draw, document, False)
    assert "2 partitions short of in-sync backups" in shown[0], shown
    assert "node-2 (catching up)" in shown[1] and "waiting for election" in shown[1] and shown[2:] == [2, 2], shown
    assert browser.execute_script(draw, document, True)[2:] == [2, 3]
