"""Prometheus metrics of a real coordinator and a real node process, and the Grafana dashboard that uses them."""

import asyncio
import json
import pathlib
import re
import socket
import subprocess
import sys
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rockstate.local.cluster import wait_until
from rockstate.testing.cluster import local_cluster

DASHBOARD = pathlib.Path(__file__).parents[2] / "docs" / "grafana" / "rockstate.json"
OPERATIONS = pathlib.Path(__file__).parents[2] / "docs" / "operations.md"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


def exported(text: str) -> dict[str, float | None]:
    """Every name a query can use -> the value of its unlabelled sample (None if it has labels or none);
    each labelled sample too, as 'name{label="value",...}'."""
    names: dict[str, float | None] = {}
    for family in text_string_to_metric_families(text):
        for name in (family.name, *(family.name + s for s in SUFFIXES.get(family.type, ()))):
            names.setdefault(name, None)
        for sample in family.samples:
            if sample.labels:
                names[sample.name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items())) + "}"] = sample.value
            elif names.get(sample.name) is None:
                names[sample.name] = sample.value
    return names


def _scrape(url: str) -> str | None:
    try:
        return urllib.request.urlopen(url).read().decode()
    except OSError:  # not listening yet
        return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    """The coordinator's and a node's /metrics, after some writes and a checkpoint."""
    root = tmp_path_factory.mktemp("metrics")
    with local_cluster(processes=True, nodes=1, partitions=4, root=str(root), checkpoints=f"file://{root}/checkpoints") as cluster:
        port = free_port()
        node = subprocess.Popen([sys.executable, "-m", "rockstate.cli", "node", "--coordinator", cluster.address, "--port", "0",
                                 "--data-dir", str(root / "metered"), "--metrics-port", str(port), "--memory-bytes", "64MiB"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_until(lambda: len(cluster.status()["nodes"]) == 2, 30, "the metered node to join")
            cluster.wait_balanced()
            with cluster.connect() as rs:
                sessions = rs.map_state("sessions")
                for i in range(200):
                    sessions.put(f"user-{i}", "last_seen", f"2026-11-23T12:{i % 60:02d}:00Z")
                rs.checkpoint()
                rs.backend.report_pipeline({"query": "sessions-by-user", "last_batch": 1, "updated": 1.0, "batches": [
                    {"batch": 0, "rows_in": 120, "rows_out": 100, "seconds": 0.8, "checkpoint_seconds": 0.1},
                    {"batch": 1, "rows_in": 80, "rows_out": 100, "seconds": 0.4, "checkpoint_seconds": 0.1}]})
                assert sessions.count() == 200
            node_text = wait_until(lambda: _scrape(f"http://127.0.0.1:{port}/metrics"), 30, "the node's metrics port")
            coordinator_text = urllib.request.urlopen(cluster.status_url + "metrics").read().decode()
        finally:
            node.kill()
            node.wait()
    return exported(coordinator_text), exported(node_text)


def test_coordinator_exports_membership_partitions_moves_and_checkpoints(scraped):
    coordinator, _ = scraped
    assert coordinator["rockstate_coordinator_partitions"] == 4
    assert coordinator["rockstate_coordinator_partitions_unavailable"] == 0
    assert coordinator["rockstate_coordinator_checkpoint_seconds_count"] == 1
    assert coordinator["rockstate_coordinator_checkpoint_size_bytes"] > 0
    assert coordinator["rockstate_coordinator_checkpoint_uploaded_bytes_total"] > 0
    assert coordinator["rockstate_coordinator_migration_seconds_count"] >= 1  # the second node took partitions
    assert coordinator["process_resident_memory_bytes"] > 0
    assert coordinator['rockstate_pipeline_batch_seconds_count{query="sessions-by-user"}'] == 2  # both batches of the progress report
    for name in ("rockstate_coordinator_members", "rockstate_coordinator_failovers_pending", "rockstate_pipeline_batch_seconds_bucket"):
        assert name in coordinator
    assert coordinator["rockstate_coordinator_loop_lag_seconds_count"] > 0  # the loop was sampled while it served
    assert 0 <= coordinator["rockstate_coordinator_loop_lag_max_seconds"] < 30  # whole milliseconds: may be 0


def test_node_exports_rocksdb_disk_and_process_figures(scraped):
    _, node = scraped
    assert node["rockstate_node_memory_limit_bytes"] == 64 << 20
    assert 0 < node["rockstate_node_rocksdb_block_cache_bytes"] <= 64 << 20
    assert node["rockstate_node_disk_used_bytes"] > 0 and node["rockstate_node_disk_free_bytes"] > 0
    assert node["rockstate_node_partitions"] >= 1
    assert node["process_resident_memory_bytes"] > 0 and node["process_open_fds"] > 0
    # sampled; the worst may be 0: uvloop's clock counts whole milliseconds, and a node opening no RocksDB per
    # partition any more may never be a millisecond late
    assert node["rockstate_node_loop_lag_seconds_count"] > 0 and 0 <= node["rockstate_node_loop_lag_max_seconds"] < 30
    assert "rockstate_node_gc_seconds_total" in node and node["rockstate_node_gc_pause_max_seconds"] >= 0
    assert 0 <= node["rockstate_node_replica_kept_bytes"] <= (64 << 20) // 8
    for name in ("rockstate_node_rocksdb_memtable_bytes", "rockstate_node_rocksdb_pending_compaction_bytes",
                 "rockstate_node_rocksdb_sst_bytes", "rockstate_node_rocksdb_write_stalls", "rockstate_node_request_seconds_bucket"):
        assert name in node


def test_every_metric_the_dashboard_names_is_exported(scraped):
    coordinator, node = scraped
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    used = {m for e in exprs for m in re.findall(r"\b((?:rockstate|process)_[a-z_]+)", e)}
    assert len(used) > 25
    missing = {m for m in used if m not in coordinator and m not in node}  # names, not the labelled samples' keys
    assert not missing, f"the dashboard names metrics nobody exports: {sorted(missing)}"
    documented = OPERATIONS.read_text()
    assert not [m for m in used if m.startswith("rockstate_") and re.sub(r"_(total|bucket|sum|count)$", "", m) not in documented]


def test_loop_lag_times_the_garbage_collectors_pauses_by_generation():
    """Each collection's time is counted under its generation while the loop is sampled, and no more once stopped."""
    import gc

    from prometheus_client import CollectorRegistry, generate_latest

    from rockstate.cluster.loop_lag import LoopLag

    async def collect(lag: LoopLag) -> None:
        lag.start()
        try:
            garbage = [[i] for i in range(200_000)]  # a full collection with something to walk
            gc.collect(2)
            gc.collect(0)
            del garbage
        finally:
            lag.stop()

    registry = CollectorRegistry()
    lag = LoopLag("rockstate_test", registry)
    asyncio.run(collect(lag))
    figures = exported(generate_latest(registry).decode())
    full, young = figures['rockstate_test_gc_seconds_total{generation="2"}'], figures['rockstate_test_gc_seconds_total{generation="0"}']
    assert full and full > 0 and young and young > 0
    assert lag.gc_total >= full + young and 0 < figures["rockstate_test_gc_pause_max_seconds"] == lag.worst_gc <= lag.gc_total
    before = lag.gc_total
    gc.collect()
    assert lag.gc_total == before and lag._collected not in gc.callbacks


def test_request_figures_export_a_prometheus_histogram_and_counters():
    """The node's hot-path figures (plain numbers, see RequestFigures) read as the histogram and counters they replace."""
    from prometheus_client import CollectorRegistry, generate_latest

    from rockstate.cluster.node.metrics import RequestFigures

    figures, registry = RequestFigures((0.001, 0.01)), CollectorRegistry()
    registry.register(figures)
    read, write = figures.recorder("read"), figures.recorder("write")
    for seconds in (0.0005, 0.001, 0.002, 3.0):  # 0.001 is in the le="0.001" bucket: bounds are inclusive
        read(seconds)
    figures.keys_read += 7
    names = exported(generate_latest(registry).decode())
    assert names['rockstate_node_request_seconds_bucket{le="0.001",op="read"}'] == 2
    assert names['rockstate_node_request_seconds_bucket{le="0.01",op="read"}'] == 3
    assert names['rockstate_node_request_seconds_bucket{le="+Inf",op="read"}'] == 4
    assert names['rockstate_node_request_seconds_count{op="read"}'] == 4
    assert names['rockstate_node_request_seconds_sum{op="read"}'] == pytest.approx(3.0035)
    assert names['rockstate_node_request_seconds_count{op="write"}'] == 0  # every served op is exported from the start
    assert names["rockstate_node_keys_read_total"] == 7 and names["rockstate_node_keys_written_total"] == 0
    write(0.1)
    assert exported(generate_latest(registry).decode())['rockstate_node_request_seconds_count{op="write"}'] == 1
