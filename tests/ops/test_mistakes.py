"""Operator mistakes, made with real processes: each is refused before it does harm, or reported as what it is."""

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
import uuid

import pytest
from prometheus_client.exposition import start_http_server
from prometheus_client import CollectorRegistry

import rockstate
from rockstate.cli import main
from rockstate.local.cluster import wait_until
from rockstate.errors import (
    CheckpointStorageError,
    ConfigError,
    NotRockstateError,
    PartitionUnavailableError,
    RockstateError,
)
from rockstate.testing.cluster import gen_cluster, local_cluster


def rockstate_cli(*args: str, timeout: float = 60, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "rockstate.cli", *args], capture_output=True, text=True,
                          timeout=timeout, input=stdin, env=env)


def members(cluster) -> dict[str, tuple[str, str]]:
    return {n["node_id"]: (n["address"], n["status"]) for n in cluster.status()["nodes"]}


def keys(n: int) -> list[str]:
    return [f"order-{uuid.UUID(int=i)}" for i in range(n)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with local_cluster(processes=True, nodes=2, partitions=8, root=str(tmp_path_factory.mktemp("live"))) as c:
        yield c


def test_second_node_on_a_live_nodes_data_dir_is_refused_before_it_registers(cluster):
    before = members(cluster)
    live = cluster.nodes()[0]
    result = rockstate_cli("node", "--coordinator", cluster.address, "--data-dir", live.data_dir, "--port", "0")
    assert result.returncode == 2
    assert f"data directory {live.data_dir} is in use by node process {live.pid}" in result.stderr
    assert f"serving on {live.address}" in result.stderr and "its own --data-dir" in result.stderr
    assert members(cluster) == before  # never registered: the live node keeps its address
    log = open(os.path.join(cluster.root, "logs", os.path.basename(live.data_dir) + ".log")).read()
    assert f"node {live.node_id} joined: serving" in log and "received partitions" in log  # lifecycle at INFO
    with cluster.connect() as rs:
        orders = rs.value_state("dup_dir_orders")
        orders.put_many({k: {"amount": i} for i, k in enumerate(keys(50))})
        assert orders.get_many(keys(50)) == [{"amount": i} for i in range(50)]


def test_second_coordinator_on_a_live_coordinators_data_dir_is_refused(cluster):
    data_dir = os.path.join(cluster.root, "coordinator")
    result = rockstate_cli("coordinator", "--data-dir", data_dir, "--port", "0")
    assert result.returncode == 2
    assert f"data directory {data_dir} is in use by coordinator process" in result.stderr
    assert cluster.status()["partitions"] == 8  # the live one serves on


def test_a_node_id_is_not_taken_over_while_its_holder_is_alive(cluster, tmp_path):
    live = cluster.nodes()[0]
    before = members(cluster)
    copy = tmp_path / "copied-node"
    copy.mkdir()
    shutil.copy(os.path.join(live.data_dir, "node.json"), copy / "node.json")  # a copied data directory's identity
    result = rockstate_cli("node", "--coordinator", cluster.address, "--data-dir", str(copy), "--port", "0")
    assert result.returncode == 2
    assert f"node id {live.node_id} belongs to a live node at {live.address}" in result.stderr
    assert members(cluster) == before


def test_a_client_at_an_http_or_metrics_port_is_told_within_a_second(cluster):
    http = cluster.status_url.rstrip("/").rsplit("/", 1)[-1]
    started = time.monotonic()
    with pytest.raises(NotRockstateError, match="an HTTP server") as err:
        rockstate.connect(http)
    assert time.monotonic() - started < 1.5 and http in str(err.value)

    server, thread = start_http_server(0, "127.0.0.1", registry=CollectorRegistry())  # a Prometheus port
    try:
        metrics = f"127.0.0.1:{server.server_port}"
        started = time.monotonic()
        with pytest.raises(RockstateError, match="rockstate greeting") as err:
            rockstate.connect(metrics)
        assert time.monotonic() - started < 1.5 and metrics in str(err.value)
    finally:
        server.shutdown()
    result = rockstate_cli("status", "--coordinator", http)
    assert result.returncode == 2 and "rockstate: error:" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("address", ["localhost", "localhost:", "localhost:http", ":7700", "localhost:99999"])
def test_an_address_without_a_port_is_a_config_error(address):
    with pytest.raises(ConfigError, match="must be host:port"):
        rockstate.connect(address)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit:
        main(["status", "--coordinator", address])  # in this process: the CLI's own handling, without seconds of imports
    assert exit.value.code == 2 and "must be host:port" in err.getvalue() and "Traceback" not in err.getvalue()


def test_checkpoint_storage_that_cannot_be_used_is_a_rockstate_error(tmp_path):
    result = rockstate_cli("coordinator", "--data-dir", str(tmp_path / "c"), "--port", "0", "--checkpoints", "ftp://no-such-host.invalid/x")
    assert result.returncode == 2 and "cannot use checkpoint storage 'ftp://no-such-host.invalid/x'" in result.stderr
    assert "Traceback" not in result.stderr

    from rockstate.checkpoint.storage import CheckpointStorage

    s3 = CheckpointStorage("s3://bucket/prefix", {"endpoint_url": "http://127.0.0.1:9", "key": "k", "secret": "s",
                                                  "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 1}})
    with pytest.raises(CheckpointStorageError, match="checkpoint storage failed on s3://bucket/prefix"):
        s3.completed_ids()


@gen_cluster(nodes=1, partitions=4, root="{tmp_path}")
def test_wildcard_host_is_never_advertised(c, tmp_path):
    for host, advertise, expected in (("0.0.0.0", "127.0.0.1", "127.0.0.1:"), ("0.0.0.0", None, None)):
        data_dir = tmp_path / f"n-{advertise}"
        proc = subprocess.Popen([sys.executable, "-m", "rockstate.cli", "node", "--coordinator", c.address, "--host", host,
                                 "--port", "0", "--data-dir", str(data_dir), *(["--advertise-host", advertise] if advertise else [])],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            address = wait_until(lambda: (json.loads((data_dir / "address.json").read_text()) if (data_dir / "address.json").exists() else {}).get("address"), 30, "the node")
            assert not address.startswith("0.0.0.0")
            if expected:
                assert address.startswith(expected)
            assert address in {n["address"] for n in c.status()["nodes"]}
        finally:
            proc.kill()
            proc.wait()


@gen_cluster(nodes=2, partitions=8, heartbeat_timeout=1.0, backup_count=0, processes=True)
def test_partial_answers_are_refused_while_a_partition_has_no_live_owner(c):
    with c.connect(retry_timeout=1.0) as rs:
        orders = rs.value_state("orders")
        orders.put_many({k: {"amount": i} for i, k in enumerate(keys(100))})
        assert orders.count() == 100
        victim = c.nodes()[0]
        held = next(n["partitions"] for n in c.status()["nodes"] if n["node_id"] == victim.node_id)
        c.kill_node(victim.node_id)
        wait_until(lambda: members(c)[victim.node_id][1] == "dead", 20, "the node to be declared dead")
        with pytest.raises(PartitionUnavailableError, match="have no live owner") as err:
            orders.count()
        assert err.value.retryable and f"({held} in all)" in str(err.value)
        with pytest.raises(PartitionUnavailableError):
            rs.stats()
        with pytest.raises(RockstateError):
            list(orders.keys())
        status = c.status()
        assert status["unavailable"] == held > 0
        result = rockstate_cli("status", "--coordinator", c.address)
        assert f"{held} partitions without a live owner" in result.stdout
        c.restart_node(victim.node_id)
        c.wait_balanced()
        assert wait_until(lambda: _count_or_none(orders), 30, "a whole count again") == 100


def _count_or_none(state):
    try:
        return state.count()
    except PartitionUnavailableError:
        return None
